"""Algorithm 1 of InstCache: the instructions a language model finds likely enough.

A breadth-first tree search from the begin token. Every node of a level is expanded by
one batched model call on its last token, reusing its path's KV states (the parent's,
gathered row by row); a child is kept while the path's cumulative NLL stays within the
budget sigma and its depth within ``max_depth``, at most ``limit(depth)`` children per
node (the most likely ones); a path that produces the end token is an instruction.

All paths of a level have the same length, so a batch needs no padding. KV states are
carried to the next level only while a level's paths and their children fit in
``kv_paths`` rows; past that a level keeps only its paths' tokens and each batch recomputes
its rows' states from them (the logits are the same; a batch costs its paths' length
instead of one token), so a level's memory stays bounded however wide the tree. The level's
frontier is written to a state file before it is expanded: a killed search resumes from
the last level (recomputing its KV states once).
"""

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from meancache.shared.files import write_json_atomic
from meancache.shared.progress import Progress
from meancache.shared.query import normalise_query
from meancache.upstream.pack.lm import InstructionLM
from transformers import DynamicCache

log = logging.getLogger(__name__)

# (up to this depth, at most this many children per node); the paper's 5,000 / 1,000.
DEFAULT_LIMITS = ((10, 5000), (10**9, 1000))

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), batch first


@dataclass(frozen=True)
class SearchConfig:
    sigma: float
    max_depth: int = 32
    limits: Sequence[tuple[int, int]] = DEFAULT_LIMITS
    batch_size: int = 64
    kv_paths: int | None = None  # the most paths whose KV states a level keeps; None: all

    def limit(self, depth: int) -> int:
        return next(limit for up_to, limit in self.limits if depth <= up_to)


@dataclass
class Frontier:
    """The paths still open at one depth, and what the search has found so far."""

    paths: list[list[int]]
    nll: list[float]
    emitted: dict[str, float] = field(default_factory=dict)  # instruction -> its best NLL
    expanded: int = 0
    peak_kv: int = 0  # the most paths' KV states held at once so far (memory bound check)


@dataclass(frozen=True)
class SearchResult:
    instructions: dict[str, float]  # normalised instruction -> NLL of its best path
    expanded: int  # nodes expanded (model rows computed)
    seconds: float
    peak_kv: int = 0  # the most paths' KV states held at once


def tree_search(lm: InstructionLM, config: SearchConfig, state_path: Path | None = None,
                progress: Progress | None = None) -> SearchResult:
    """Expand from the begin token until no path is open."""
    start = time.perf_counter()
    frontier = expand_levels(lm, config, None, state_path, progress)
    return SearchResult(frontier.emitted, frontier.expanded, time.perf_counter() - start,
                        frontier.peak_kv)


def expand_levels(lm: InstructionLM, config: SearchConfig, roots: Frontier | None = None,
                  state_path: Path | None = None, progress: Progress | None = None,
                  until_depth: int | None = None) -> Frontier:
    """Expand level by level until no path is open, or until the open paths are
    ``until_depth`` tokens past the begin token (the base tree of a parallel search)."""
    lm.check_depth(config.max_depth)
    frontier = _resume(state_path, config) if state_path else None
    if frontier is None:
        frontier = roots or Frontier([[lm.bos]], [0.0])
    kv: KV | None = None  # None: compute the frontier's states from its paths
    while frontier.paths:
        depth = len(frontier.paths[0])  # the depth of the children made now
        if until_depth is not None and depth > until_depth:
            return frontier
        if state_path is not None:
            _save(state_path, config, frontier)
        if progress is not None:
            progress(depth - 1, config.max_depth)
        frontier, kv = _expand(lm, config, frontier, kv, depth)
    if progress is not None:
        progress(config.max_depth, config.max_depth)
    if state_path is not None:
        _save(state_path, config, frontier)
    return frontier


@torch.inference_mode()
def _expand(lm: InstructionLM, config: SearchConfig, frontier: Frontier, kv: KV | None,
            depth: int) -> tuple[Frontier, KV | None]:
    children: list[list[int]] = []
    child_nll: list[float] = []
    parents: list[int] = []
    states: list[KV] = []  # the rows' KV states, while the next level may keep them
    collected = 0  # rows in ``states``
    keep = True
    held = len(frontier.paths) if kv is not None else 0  # the level's incoming states
    peak = frontier.peak_kv
    banned = [t for t in {lm.bos, lm.pad} if t != lm.eos]
    limit = config.limit(depth)
    for first in range(0, len(frontier.paths), config.batch_size):
        rows = range(first, min(first + config.batch_size, len(frontier.paths)))
        if kv is None:
            ids = torch.tensor([frontier.paths[r] for r in rows])
            out = lm.model(input_ids=ids, use_cache=True)
        else:
            cache = DynamicCache(ddp_cache_data=[(k[rows.start:rows.stop],
                                                  v[rows.start:rows.stop]) for k, v in kv])
            ids = torch.tensor([[frontier.paths[r][-1]] for r in rows])
            out = lm.model(input_ids=ids, past_key_values=cache, use_cache=True)
        peak = max(peak, held + collected + len(rows))
        if keep:
            states.append([(layer.keys, layer.values)
                           for layer in out.past_key_values.layers])
            collected += len(rows)
        logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        logprobs[:, banned] = -torch.inf
        top = torch.topk(logprobs, min(limit, logprobs.shape[-1]), dim=-1)
        for offset, row in enumerate(rows):
            budget = config.sigma - frontier.nll[row]
            for lp, token in zip(top.values[offset].tolist(), top.indices[offset].tolist(),
                                 strict=True):
                if -lp > budget:
                    break  # sorted: every later child is less likely still
                nll = frontier.nll[row] - lp
                if token == lm.eos:
                    text = normalise_query(lm.decode(frontier.paths[row][1:]))
                    if text and nll < frontier.emitted.get(text, float("inf")):
                        frontier.emitted[text] = nll
                elif depth < config.max_depth:  # else it could never reach its end token
                    children.append([*frontier.paths[row], token])
                    child_nll.append(nll)
                    parents.append(row)
        frontier.expanded += len(rows)
        if keep and config.kv_paths is not None and max(collected, len(children)) > \
                config.kv_paths:
            keep, collected = False, 0  # too wide: the next level recomputes from tokens
            states.clear()
    next_kv = None
    if keep and children:
        index = torch.tensor(parents, dtype=torch.long)
        next_kv = [(torch.cat([s[layer][0] for s in states])[index],
                    torch.cat([s[layer][1] for s in states])[index])
                   for layer in range(len(states[0]))]
        peak = max(peak, held + collected + len(children))
    return Frontier(children, child_nll, frontier.emitted, frontier.expanded, peak), next_kv


def _save(path: Path, config: SearchConfig, frontier: Frontier) -> None:
    write_json_atomic(path, {"config": asdict(config), **asdict(frontier)})


def same_search(saved: dict[str, Any], config: SearchConfig) -> bool:
    """Whether a saved search's config finds what ``config`` finds (batching and memory
    do not matter: a search killed for lack of memory resumes with a smaller
    ``kv_paths``)."""
    def outcome(settings: dict[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in settings.items() if k not in ("batch_size", "kv_paths")}
        return {**kept, "limits": [tuple(x) for x in settings.get("limits", [])]}

    return outcome(saved) == outcome(asdict(config))


def _resume(path: Path, config: SearchConfig) -> Frontier | None:
    """The last saved level of a search with this very config, if any."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    saved = state.get("config", {})
    if not same_search(saved, config):
        log.warning("%s belongs to another search (%s); starting afresh", path, saved)
        return None
    log.info("resuming the tree search from %s", path)
    return Frontier(state["paths"], state["nll"], state["emitted"], state["expanded"],
                    state.get("peak_kv", 0))
