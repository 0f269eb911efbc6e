"""Negative log-likelihood of whole instructions under the instruction LM: its empirical
CDF on validation instructions is InstCache's predicted hit rate for a budget sigma."""

import math

import torch
from meancache.upstream.pack.lm import InstructionLM


@torch.inference_mode()
def instruction_nll(lm: InstructionLM, texts: list[str], max_depth: int,
                    batch_size: int = 32) -> list[float]:
    """The NLL (nats) of ``tokens + eos`` after ``bos`` for each text; inf for a text the
    search cannot reach (more than ``max_depth`` tokens with its end token)."""
    if lm.deepest is not None:  # a longer instruction is out of the search's reach too
        max_depth = min(max_depth, lm.deepest)
    rows = [lm.encode(t, max_depth) for t in texts]
    reachable = [i for i, row in enumerate(rows) if len(row) - 1 <= max_depth]
    out = [math.inf] * len(texts)
    for start in range(0, len(reachable), batch_size):
        chunk = reachable[start:start + batch_size]
        width = max(len(rows[i]) for i in chunk)
        ids = torch.full((len(chunk), width), lm.pad)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, i in enumerate(chunk):
            ids[j, :len(rows[i])] = torch.tensor(rows[i])
            mask[j, :len(rows[i])] = 1
        logits = lm.model(input_ids=ids, attention_mask=mask).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        picked = logprobs.gather(-1, ids[:, 1:, None])[..., 0] * mask[:, 1:]
        for j, i in enumerate(chunk):
            out[i] = -float(picked[j].sum())
    return out
