"""Choosing the next token (greedy, temperature, top-p, repetition penalties) and knowing
when to stop: stop strings, and an answer caught in a loop.

Small models, Gemma 3 270M among them, fall into loops ("he is a very good actor. he is a
very good actor. ..."), each costing a whole token budget. Three guards, as llama.cpp ships
them: a repetition penalty over the recent tokens (``repetition_penalty``,
``repetition_window``, its ``repeat_penalty``/``repeat_last_n``); DRY, a penalty growing
exponentially with the length of the earlier run a token would repeat (``dry_*``, its own
names); and a stop once the answer has repeated one n-gram ``LOOP_REPEATS`` times
(``stop_on_loops``). OpenAI's ``frequency_penalty`` and ``presence_penalty`` are honoured
as its API defines them.
"""

from collections import Counter

import torch
from meancache.upstream.sampling_params import SamplingParams
from transformers import PreTrainedTokenizerBase

# Below this temperature sampling is the argmax (logits / 1e-40 overflow float32 to inf,
# and the softmax of infinities is not a distribution).
GREEDY_BELOW = 1e-4
LOOP_NGRAM = 8  # tokens in the span whose repeats mark a loop (about one phrase)
LOOP_REPEATS = 4  # its occurrences in one answer that stop it: a phrase said 4 times
DRY_LONGEST = 48  # runs longer than this are penalised as this long (already prohibitive)
DRY_PROMPT = 1024  # the prompt's last tokens DRY also reads: an answer that copies the
# question back is a loop of its own (llama.cpp's DRY reads the whole context)


class History:
    """The tokens that the penalties and the loop stop look at: the prompt's tail and the
    answer so far, with counts kept as tokens arrive (O(1) a token)."""

    def __init__(self, prompt_ids: list[int] | tuple[int, ...], params: SamplingParams) -> None:
        self._params = params
        self._recent = list(prompt_ids[-params.repetition_window:]
                            if params.repetition_window else [])
        self._answer: list[int] = []
        self._counts: Counter[int] = Counter()
        self._ngrams: Counter[tuple[int, ...]] = Counter()
        # DRY's text: the prompt's tail, then the answer; token -> where it stands in it
        self._said: list[int] = list(prompt_ids[-DRY_PROMPT:]) if params.dry_multiplier else []
        self._positions: dict[int, list[int]] = {}
        for at, token in enumerate(self._said):
            self._positions.setdefault(token, []).append(at)
        self.looping = False

    def add(self, token: int) -> None:
        if self._params.dry_multiplier:
            self._positions.setdefault(token, []).append(len(self._said))
            self._said.append(token)
        self._answer.append(token)
        self._counts[token] += 1
        if self._params.repetition_window:
            self._recent.append(token)
            del self._recent[:-self._params.repetition_window]
        if len(self._answer) >= LOOP_NGRAM:
            ngram = tuple(self._answer[-LOOP_NGRAM:])
            self._ngrams[ngram] += 1
            self.looping = self._params.stop_on_loops and self._ngrams[ngram] >= LOOP_REPEATS

    def penalise(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (vocab,) with the penalties applied, as a new tensor."""
        params = self._params
        if not params.penalised:
            return logits
        logits = logits.float().clone()
        if params.repetition_penalty != 1.0 and self._recent:
            seen = torch.tensor(sorted(set(self._recent)), dtype=torch.long)
            values = logits[seen]
            logits[seen] = torch.where(values > 0, values / params.repetition_penalty,
                                       values * params.repetition_penalty)
        if self._counts and (params.frequency_penalty or params.presence_penalty):
            ids = torch.tensor(list(self._counts), dtype=torch.long)
            counts = torch.tensor(list(self._counts.values()), dtype=logits.dtype)
            logits[ids] -= counts * params.frequency_penalty + params.presence_penalty
        if params.dry_multiplier:
            for token, run in self.repeated_runs().items():
                if run >= params.dry_allowed_length:
                    logits[token] -= params.dry_multiplier * params.dry_base ** (
                        run - params.dry_allowed_length)
        return logits

    def repeated_runs(self) -> dict[int, int]:
        """For each token that has followed the last token before (in the prompt's tail or
        the answer): the length of the longest run ending in the last token that it would
        repeat (the run's earlier copy followed by that token). Only earlier places of the
        last token are visited."""
        said = self._said
        if not said:
            return {}
        end = len(said) - 1
        runs: dict[int, int] = {}
        for at in self._positions[said[end]][:-1]:
            run = 1
            while run < DRY_LONGEST and run <= at and said[at - run] == said[end - run]:
                run += 1
            follower = said[at + 1]
            runs[follower] = max(run, runs.get(follower, 0))
        return runs


def next_token(logits: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None) -> int:
    """Pick a token from (vocab,) logits."""
    logits = in_range(logits.float())
    if params.temperature < GREEDY_BELOW:
        return int(logits.argmax())
    probs = torch.softmax(in_range(logits / params.temperature), dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < params.top_p
        keep[0] = True  # the likeliest token always stays, however small top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def in_range(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` with what left float32's range brought back to its ends: +inf to the
    largest value, -inf and NaN to the smallest. A request's penalty may take a logit out
    of range (a repetition_penalty of 1e-80 divides the seen tokens' logits to inf), and
    the softmax of two infinities is NaN, no distribution; brought back, the softmax is
    the limit the infinities stood for (the likeliest tokens share all the mass)."""
    info = torch.finfo(logits.dtype)
    return torch.nan_to_num(logits, nan=info.min, posinf=info.max, neginf=info.min)


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
