"""What a request asks of sampling, with its checks: a module of its own, without torch, so
that the command line can show the server's defaults without loading a model library."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    repetition_penalty: float = 1.0  # > 1: tokens seen in the window become less likely
    repetition_window: int = 64  # the last tokens (prompt and answer) it looks at
    frequency_penalty: float = 0.0  # OpenAI's: minus this x a token's count in the answer
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token is in the answer
    stop_on_loops: bool = False
    # DRY ("don't repeat yourself", llama.cpp's dry_*): a token that would extend a run
    # already said earlier in the answer loses dry_multiplier x dry_base^(run -
    # dry_allowed_length) of its logit, so a phrase can recur but a loop cannot grow.
    dry_multiplier: float = 0.0  # 0: off
    dry_base: float = 1.75
    dry_allowed_length: int = 2

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must lie in [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must lie in (0, 1]")
        if any(not s for s in self.stop) or len(self.stop) > 4:
            raise ValueError("stop takes up to 4 non-empty strings")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError("repetition_penalty must lie in (0, 2]")
        if not 0 <= self.repetition_window <= 4096:
            raise ValueError("repetition_window must lie in [0, 4096]")
        if not 0.0 <= self.dry_multiplier <= 8.0:
            raise ValueError("dry_multiplier must lie in [0, 8]")
        if not 1.0 <= self.dry_base <= 4.0:
            raise ValueError("dry_base must lie in [1, 4]")
        if not 1 <= self.dry_allowed_length <= 64:
            raise ValueError("dry_allowed_length must lie in [1, 64]")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must lie in [-2, 2]")

    @property
    def penalised(self) -> bool:
        return (self.repetition_penalty != 1.0 and self.repetition_window > 0) or bool(
            self.frequency_penalty or self.presence_penalty or self.dry_multiplier)


# A request that sets none of these gets them (``upstream serve`` flags change them): the
# repetition guard on, as llama.cpp and Ollama ship theirs (penalty 1.1 over 64 tokens),
# with DRY at llama.cpp's suggested 0.8 x 1.75^(run - 2) (chosen on the validation part of
# the Arena first turns: benchmarks/repetition_guard.py).
SERVER_DEFAULTS = SamplingParams(max_tokens=256, repetition_penalty=1.1, repetition_window=64,
                                 stop_on_loops=True, dry_multiplier=0.8)
