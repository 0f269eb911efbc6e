"""`meancache pack train-lm|plan|build`: the upstream's instruction-pack commands."""

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from meancache.shared.arguments import count, real
from meancache.upstream.config import UpstreamSettings

log = logging.getLogger(__name__)

LOG_EVERY = 30.0  # seconds between progress lines in the log file

DEFAULT_DATA = "../shared/data/instructions/arena_first_turns.jsonl"


def add_commands(pack: Any) -> None:
    train = pack.add_parser("train-lm", help="train the instruction language model")
    train.add_argument("--data", type=Path, required=True, help="instructions, JSON lines "
                       f"with a 'text' field (e.g. {DEFAULT_DATA})")
    train.add_argument("--out", type=Path, required=True, help="where the model is saved")
    train.add_argument("--base", help="fine-tune this model (builtin:gemma-3-270m, a "
                       "builtin:tiny* test model, or a local directory) instead of training a "
                       "small GPT-2 from scratch")
    train.add_argument("--epochs", type=count(1), default=2)
    train.add_argument("--batch-size", type=count(1), default=32)
    train.add_argument("--layers", type=count(1), default=4, help="from scratch only")
    train.add_argument("--hidden", type=count(1), default=256, help="from scratch only")
    train.add_argument("--seed", type=count(0), default=0,
                       help="also seeds the 80/10/10 split")
    train.add_argument("--learning-rate", type=real(above=0.0), help="default: 1e-3 from "
                       "scratch, 5e-5 for a base model")
    train.add_argument("--max-tokens", type=count(1), default=48, help="longer instructions "
                       "are cut")
    train.add_argument("--limit", type=count(1), help="train on the first N instructions of the "
                       "train split (a base model on a CPU)")
    train.add_argument("--freeze-embeddings", action="store_true", help="keep the input "
                       "embedding (Gemma: tied to the output layer, 170M of 270M parameters) "
                       "fixed: about half the time and memory per step")
    train.add_argument("--checkpoint-every", type=count(1), default=200, help="steps")
    train.set_defaults(handler=run_train)

    plan = pack.add_parser("plan", help="predict a pack's size and hit rate for a sigma, "
                           "or the sigma for a hit rate")
    _search_arguments(plan)
    plan.add_argument("--data", type=Path, required=True, help="the instructions the LM "
                      "was trained on (its validation split is used)")
    plan.add_argument("--fit-sigmas", type=real(above=0.0), nargs=2, required=True,
                      metavar=("SIGMA1", "SIGMA2"), help="two small budgets to search at "
                      "and fit N = a(e^(b sigma) - 1) to")
    goal = plan.add_mutually_exclusive_group(required=True)
    goal.add_argument("--sigma", type=real(above=0.0), help="the budget to predict for")
    goal.add_argument("--hit-rate", type=real(above=0.0, maximum=1.0),
                      help="the hit rate (0-1) to find sigma for")
    plan.add_argument("--packs-dir", type=Path, help="where `pack build` published packs: "
                      "the newest one's size is set against what this fit predicts for its "
                      "sigma (default: none)")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(handler=run_plan)

    build = pack.add_parser("build", help="search the instructions under sigma, answer "
                            "them with the upstream's model, and publish the pack")
    _search_arguments(build)
    build.add_argument("--sigma", type=real(above=0.0), required=True, help="the NLL budget")
    build.add_argument("--model", help="the model that answers (default: upstream_model in "
                       "config.toml, else builtin:gemma-3-270m); the device refuses a pack of "
                       "another model")
    build.add_argument("--packs-dir", type=Path, required=True,
                       help="where `upstream serve --packs-dir` publishes packs")
    build.add_argument("--work-dir", type=Path, help="search state and answers so far, "
                       "for resuming (default: PACKS_DIR/work-SIGMA)")
    build.add_argument("--max-tokens", type=count(1), default=256, help="longest answer")
    build.add_argument("--workers", type=count(1), default=1, help="expand subtrees in this "
                       "many Ray tasks at once (local Ray; 1: in this process); either "
                       "resumes after a kill")
    build.add_argument("--ray-address", help="a Ray cluster to expand subtrees on")
    build.set_defaults(handler=run_build)


def _search_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lm", type=Path, required=True, help="the trained instruction LM")
    parser.add_argument("--max-depth", type=count(1), default=32, help="tokens per instruction")
    parser.add_argument("--children", type=count(1), nargs=2, default=(5000, 1000),
                        metavar=("UP_TO_10", "DEEPER"),
                        help="children kept per node up to depth 10, and deeper")
    parser.add_argument("--batch-size", type=count(1), default=64, help="paths per model call")
    parser.add_argument("--kv-paths", type=count(1), default=4096, help="the most paths whose KV "
                        "states a level keeps; a wider level recomputes them batch by batch "
                        "(Gemma 3 270M: about 36 KB per path and token)")


def _search_config(args: argparse.Namespace, sigma: float) -> Any:
    from meancache.upstream.pack.search import SearchConfig

    shallow, deep = args.children
    return SearchConfig(sigma, args.max_depth, ((10, shallow), (10**9, deep)), args.batch_size,
                        args.kv_paths)


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A bar on stderr for a long builder job, and a line in the log file at most every
    ``LOG_EVERY`` seconds and at the end (a job run in the background is followed there)."""
    from meancache.shared.progress_bar import ProgressBar
    from rich.console import Console

    last = 0.0
    with ProgressBar(label, Console(stderr=True)) as bar:
        def show(done: int, total: int) -> None:
            nonlocal last
            bar(done, total)
            now = time.monotonic()
            if now - last >= LOG_EVERY or (total and done >= total):
                last = now
                log.info("%s: %d/%s", label, done, total or "?")

        yield show


def run_train(args: argparse.Namespace, settings: UpstreamSettings) -> int:
    from meancache.upstream.pack.lm import TrainConfig, train_lm

    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, layers=args.layers,
                         hidden=args.hidden, seed=args.seed, learning_rate=args.learning_rate,
                         max_tokens=args.max_tokens, limit=args.limit,
                         freeze_embeddings=args.freeze_embeddings,
                         checkpoint_every=args.checkpoint_every)
    with progress_bar("training steps") as progress:
        out = train_lm(args.data, args.out, args.base, config, progress, settings.data_dir)
    print(f"instruction LM saved in {out} (checkpoints every {config.checkpoint_every} "
          "steps; a killed run resumes when started again)")
    return 0


def run_plan(args: argparse.Namespace, settings: UpstreamSettings) -> int:
    from meancache.upstream.pack.data import read_instructions, split_instructions
    from meancache.upstream.pack.lm import META_FILE, load_lm
    from meancache.upstream.pack.nll import instruction_nll
    from meancache.upstream.pack.plan import (
        SizeModel,
        predicted_hit_rate,
        sigma_for_hit_rate,
    )
    from meancache.upstream.pack.search import tree_search

    lm = load_lm(args.lm)
    meta = json.loads((args.lm / META_FILE).read_text(encoding="utf-8"))
    validation = split_instructions(read_instructions(args.data),
                                    meta["config"]["seed"]).validation
    nlls = instruction_nll(lm, validation, args.max_depth)
    small, large = sorted(args.fit_sigmas)
    sizes = []
    for sigma in (small, large):
        with progress_bar(f"search at sigma {sigma:g}, depth") as progress:
            sizes.append(len(tree_search(lm, _search_config(args, sigma),
                                         progress=progress).instructions))
    model = SizeModel.fit(small, sizes[0], large, sizes[1])
    sigma = args.sigma if args.sigma is not None else sigma_for_hit_rate(nlls, args.hit_rate)
    result = {"sigma": sigma, "predicted_size": round(model.size(sigma)),
              "predicted_hit_rate": predicted_hit_rate(nlls, sigma),
              "fit": {"a": model.a, "b": model.b, "sigmas": [small, large], "sizes": sizes},
              "validation_instructions": len(validation)}
    built = last_build(args.packs_dir) if args.packs_dir is not None else None
    if built is not None:
        result["last_build"] = built_against_fit(built, model)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"sigma {sigma:.2f}: about {result['predicted_size']:,} instructions, predicted "
          f"hit rate {result['predicted_hit_rate']:.1%} (N = {model.a:.3g}"
          f"(e^({model.b:.3g} sigma) - 1), fitted on N({small:g}) = {sizes[0]}, "
          f"N({large:g}) = {sizes[1]}; {len(validation)} validation instructions)")
    if built is not None:
        check = result["last_build"]
        off = f"{check['ratio']:.2f}x the build" if check["ratio"] else "the build is empty"
        print(f"the newest build in {args.packs_dir} (pack {check['pack_id']}, sigma "
              f"{check['sigma']:g}) holds {check['count']:,} instructions; this fit predicts "
              f"{check['predicted']:,} there ({off})")
    elif args.packs_dir is not None:
        print(f"no build in {args.packs_dir} to check this fit against")
    return 0


def last_build(packs_dir: Path) -> Any:
    """The manifest of the newest readable pack in ``packs_dir`` (by its ``created``), or
    None."""
    from meancache.shared.errors import PackError
    from meancache.shared.pack import read_manifest

    found = []
    for path in packs_dir.glob("*.mcpack"):
        try:
            found.append(read_manifest(path))
        except PackError:
            continue
    return max(found, key=lambda manifest: manifest.created, default=None)


def built_against_fit(built: Any, model: Any) -> dict[str, Any]:
    """How far the fit is from a build: its prediction at the build's sigma, and
    prediction / found (1.0: exact; the pack holds the instructions that got an answer)."""
    predicted = round(model.size(built.sigma))
    return {"pack_id": built.pack_id, "sigma": built.sigma, "count": built.count,
            "predicted": predicted, "ratio": predicted / built.count if built.count else None}


def run_build(args: argparse.Namespace, settings: UpstreamSettings) -> int:
    from meancache.upstream.model_loading import load_model
    from meancache.upstream.pack.build import answer_instructions, publish_pack
    from meancache.upstream.pack.lm import load_lm
    from meancache.upstream.pack.search import tree_search

    work = args.work_dir or args.packs_dir / f"work-{args.sigma:g}"
    work.mkdir(parents=True, exist_ok=True)
    config = _search_config(args, args.sigma)
    if args.workers > 1 or args.ray_address:
        from meancache.upstream.pack.parallel import parallel_search

        with progress_bar("subtree groups") as progress:
            found = parallel_search(args.lm, config, args.workers,
                                    ray_address=args.ray_address, progress=progress,
                                    work_dir=work / "ray")
    else:
        with progress_bar("search depth") as progress:
            found = tree_search(load_lm(args.lm), config, work / "search.json", progress)
    instructions = sorted(found.instructions, key=found.instructions.__getitem__)
    print(f"{len(instructions)} instructions within sigma {args.sigma:g} "
          f"({found.expanded} nodes expanded in {found.seconds:.1f}s)", file=sys.stderr)
    loaded = load_model(args.model or settings.embedded_model, data_dir=settings.data_dir)
    with progress_bar("answering") as progress:
        answers = answer_instructions(loaded, instructions, work / "answers.jsonl",
                                      args.max_tokens, progress)
    path, manifest = publish_pack(answers, loaded.name, args.sigma, args.packs_dir)
    print(f"published {path}: {manifest.count} instructions answered by {manifest.model} "
          f"(pack {manifest.pack_id})")
    return 0
