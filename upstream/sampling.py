"""Choosing the next token (greedy, temperature, top-p) and turning tokens into text
that stops at stop strings."""

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must lie in [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must lie in (0, 1]")
        if any(not s for s in self.stop) or len(self.stop) > 4:
            raise ValueError("stop takes up to 4 non-empty strings")


def next_token(logits: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None) -> int:
    """Pick a token from (vocab,) logits."""
    if params.temperature == 0.0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < params.top_p  # the first always stays
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


class TextStream:
    """Decodes generated tokens incrementally, holding back text that could still turn out
    to be the start of a stop string or an incomplete UTF-8 character. An answer starts at
    its first visible character: a prompt ending in "Answer:" is continued with " Paris"."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._ids: list[int] = []
        self._emitted = 0
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add a token; return the text that is now safe to show."""
        self._ids.append(token_id)
        text = self._text()
        for stop in self._stop:
            at = text.find(stop, max(0, self._emitted - len(stop)))
            if at != -1:
                self.stopped = True
                return self._take(text[:at])
        if text.endswith("\ufffd"):
            return ""
        hold = max((len(s) - 1 for s in self._stop), default=0)
        for size in range(min(hold, len(text)), 0, -1):
            if any(s.startswith(text[-size:]) for s in self._stop):
                return self._take(text[:-size])
        return self._take(text)

    def flush(self) -> str:
        """The held-back text, once generation has ended without a stop string."""
        if self.stopped:
            return ""
        return self._take(self._text())

    def _text(self) -> str:
        return self._tokenizer.decode(self._ids, skip_special_tokens=True).lstrip()

    def _take(self, upto: str) -> str:
        if len(upto) <= self._emitted:
            return ""
        new = upto[self._emitted:]
        self._emitted = len(upto)
        return new
