"""Algorithm 1 beyond one process: the driver expands the base tree to ``split_depth``,
then each group of its open paths is a Ray task that expands those subtrees to the end
(loading the instruction LM itself); the results are merged (an instruction reached by
several paths keeps its smallest NLL). Local Ray by default, or a cluster by address.

Given a job folder, the driver writes the base tree and its grouping there, then each
finished group's result as it arrives (atomically, so workers need no shared disk): a
killed search started again with the same folder skips the groups already done.
"""

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from meancache.shared.extras import require
from meancache.shared.files import write_json_atomic
from meancache.shared.progress import Progress
from meancache.upstream.pack.lm import load_lm
from meancache.upstream.pack.search import (
    Frontier,
    SearchConfig,
    SearchResult,
    expand_levels,
    same_search,
)

log = logging.getLogger(__name__)

BASE_FILE = "base.json"


def _subtrees(lm_dir: str, config: SearchConfig, paths: list[list[int]],
              nll: list[float]) -> tuple[dict[str, float], int]:
    """One Ray task: the subtrees under ``paths``, from scratch in the worker."""
    import torch

    torch.set_num_threads(1)  # one task per core
    found = expand_levels(load_lm(Path(lm_dir)), config, Frontier(paths, nll))
    return found.emitted, found.expanded


def _base_tree(lm_dir: Path, config: SearchConfig, split_depth: int, groups: int,
               work_dir: Path | None) -> tuple[Frontier, int]:
    """The base tree and its number of groups: the job folder's, if it holds this very
    search (the grouping must not change on a restart with other --workers), else new."""
    path = work_dir / BASE_FILE if work_dir else None
    if path is not None and path.is_file():
        saved: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if same_search(saved["config"], config) and saved["split_depth"] == split_depth:
            log.info("resuming the Ray search in %s", work_dir)
            return Frontier(saved["paths"], saved["nll"], saved["emitted"],
                            saved["expanded"]), saved["groups"]
        log.warning("%s belongs to another search; starting afresh", path)
    base = expand_levels(load_lm(lm_dir), config, until_depth=split_depth)
    groups = max(1, min(len(base.paths), groups))
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        for old in work_dir.glob("subtree-*.json"):
            old.unlink()
        write_json_atomic(work_dir / BASE_FILE, {"config": asdict(config),
                                                 "split_depth": split_depth,
                                                 "groups": groups, **asdict(base)})
    return base, groups


def _merge(emitted: dict[str, float], found: dict[str, float]) -> None:
    for text, nll in found.items():
        emitted[text] = min(nll, emitted.get(text, nll))


def parallel_search(lm_dir: Path, config: SearchConfig, workers: int = 2,
                    split_depth: int = 2, ray_address: str | None = None,
                    progress: Progress | None = None,
                    work_dir: Path | None = None) -> SearchResult:
    """``work_dir``: where the job's state lives, to resume after a kill (None: none)."""
    require("ray", "server", "building a pack on several workers (--workers, --ray-address)")
    import ray

    start = time.perf_counter()
    # A few groups per worker balance the load.
    base, groups = _base_tree(lm_dir, config, split_depth, workers * 4, work_dir)
    emitted, expanded = dict(base.emitted), base.expanded
    if not base.paths:
        return SearchResult(emitted, expanded, time.perf_counter() - start)
    todo = []
    for group in range(groups):
        done_file = work_dir / f"subtree-{group}.json" if work_dir else None
        if done_file is not None and done_file.is_file():
            finished = json.loads(done_file.read_text(encoding="utf-8"))
            _merge(emitted, finished["emitted"])
            expanded += finished["expanded"]
        else:
            todo.append(group)
    done = groups - len(todo)
    if progress is not None and done:
        progress(done, groups)
    if not todo:
        return SearchResult(emitted, expanded, time.perf_counter() - start)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=ray_address, num_cpus=None if ray_address else workers,
                 include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=1)(_subtrees)
    pending = {task.remote(str(lm_dir), config, base.paths[g::groups], base.nll[g::groups]): g
               for g in todo}
    try:
        while pending:
            [ready], _ = ray.wait(list(pending))
            group = pending.pop(ready)
            found, count = ray.get(ready)
            if work_dir is not None:
                write_json_atomic(work_dir / f"subtree-{group}.json",
                                  {"emitted": found, "expanded": count})
            _merge(emitted, found)
            expanded += count
            done += 1
            if progress is not None:
                progress(done, groups)
    finally:
        for ref in pending:  # a failure or an interrupt: stop what is left
            ray.cancel(ref)
        if started_here:
            ray.shutdown()
    return SearchResult(emitted, expanded, time.perf_counter() - start)
