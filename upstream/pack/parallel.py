"""Algorithm 1 beyond one process: the driver expands the base tree to ``split_depth``,
then each group of its open paths is a Ray task that expands those subtrees to the end
(loading the instruction LM itself); the results are merged (an instruction reached by
several paths keeps its smallest NLL). Local Ray by default, or a cluster by address."""

import time
from pathlib import Path

from meancache.shared.progress import Progress
from meancache.upstream.pack.lm import load_lm
from meancache.upstream.pack.search import Frontier, SearchConfig, SearchResult, expand_levels


def _subtrees(lm_dir: str, config: SearchConfig, paths: list[list[int]],
              nll: list[float]) -> tuple[dict[str, float], int]:
    """One Ray task: the subtrees under ``paths``, from scratch in the worker."""
    import torch

    torch.set_num_threads(1)  # one task per core
    found = expand_levels(load_lm(Path(lm_dir)), config, Frontier(paths, nll))
    return found.emitted, found.expanded


def parallel_search(lm_dir: Path, config: SearchConfig, workers: int = 2,
                    split_depth: int = 2, ray_address: str | None = None,
                    progress: Progress | None = None) -> SearchResult:
    import ray

    start = time.perf_counter()
    base = expand_levels(load_lm(lm_dir), config, until_depth=split_depth)
    if not base.paths:
        return SearchResult(base.emitted, base.expanded, time.perf_counter() - start)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=ray_address, num_cpus=None if ray_address else workers,
                 include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_subtrees)
        groups = max(1, min(len(base.paths), workers * 4))  # a few per worker: balance
        pending = [task.remote(str(lm_dir), config, base.paths[i::groups],
                               base.nll[i::groups]) for i in range(groups)]
        emitted, expanded = dict(base.emitted), base.expanded
        for done in range(1, groups + 1):
            [ready], pending = ray.wait(pending)
            found, count = ray.get(ready)
            expanded += count
            for text, nll in found.items():
                emitted[text] = min(nll, emitted.get(text, nll))
            if progress is not None:
                progress(done, groups)
    finally:
        if started_here:
            ray.shutdown()
    return SearchResult(emitted, expanded, time.perf_counter() - start)
