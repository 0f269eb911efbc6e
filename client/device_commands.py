"""The device's commands: `cache ...` to inspect and manage the semantic cache, `chat`
and `ask` to answer questions, `eval pairs` to measure the match decision on labelled
pairs. The `meancache` command (meancache/cli.py) mounts them beside the other sides'.

The encoder (torch) is imported only by the commands that embed: `cache stats` and
`cache list` read the store, and `--help` loads no model.
"""

import argparse
import dataclasses
import json
import sys
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from meancache.client.cache import repair
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import stored_stats
from meancache.client.config import Settings, with_upstream
from meancache.client.matching.settings import VERIFIERS
from meancache.shared.arguments import count, share
from meancache.shared.errors import MeanCacheError
from meancache.shared.files import write_atomic
from meancache.shared.hosts import port_argument
from meancache.shared.progress_bar import ProgressBar
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from meancache.client.cache import Entry, SemanticCache
    from meancache.client.chat.session import UpstreamStarter
    from meancache.shared.encoder import Encoder
    from meancache.shared.verifier.runtime import LearnedVerifier

out = Console()
err = Console(stderr=True)


def _counted(count: int, one: str, many: str) -> str:
    """``count`` with the noun that agrees with it: "1 entry", "2 entries"."""
    return f"{count} {one if count == 1 else many}"


def print_json(data: object) -> None:
    """Plain JSON on stdout for scripts: no colour, no wrapping."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")


def assemble_encoder(settings: Settings) -> None:
    """Assemble a packaged encoder (MPNet) on its first start, with a progress bar; later
    starts only check the copy (milliseconds)."""
    from meancache.shared.encoder import locate_model

    with ProgressBar("assembling the encoder (first start only)", err) as progress:
        locate_model(settings.encoder_model, settings.models_dir, progress)


def device_models(settings: Settings) -> "tuple[Encoder, LearnedVerifier | None]":
    """The device's encoder and verifier, loaded once for the caches opened with them."""
    from meancache.client.encoder import load_device_encoder
    from meancache.client.verifier import load_device_verifier

    assemble_encoder(settings)
    with err.status("loading the embedding model (the first start exports it to ONNX)"):
        return load_device_encoder(settings), load_device_verifier(settings)


def open_cache(settings: Settings, directory: Path | None = None,
               models: "tuple[Encoder, LearnedVerifier | None] | None" = None, **options: object
               ) -> "SemanticCache":
    """The device's cache (``models``: from ``device_models``, loaded here if None;
    ``options``: SemanticCache's keywords, e.g. ``learns``)."""
    from meancache.client.cache import SemanticCache

    encoder, verifier = models or device_models(settings)
    with ProgressBar("re-embedding cached queries", err) as progress:
        return SemanticCache(directory or settings.cache_dir, encoder,
                             settings.cache_settings(), progress, verifier=verifier, **options)


# cache -------------------------------------------------------------------------------
def cmd_cache_stats(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.stats_plots import stats_plots
    from meancache.client.verifier import device_verifier_card

    with closing(EntryStore(settings.cache_dir)) as store:  # no encoder: nothing to embed
        stats = stored_stats(store, settings.global_threshold, settings.encoder_backend,
                             settings.max_wrong_rate,
                             device_verifier_card(settings)
                             if settings.cache_settings().learned else None,
                             settings.learned_decision, settings.learns_from_answers,
                             settings.explore_rate, settings.explore_warmup)
        plots = [] if args.json else stats_plots(store, stats.threshold)
    if args.json:
        print_json(dataclasses.asdict(stats) | {"hit_rate": stats.hit_rate,
                                                "token_saving_ratio": stats.token_saving_ratio})
        return 0
    table = Table("statistic", "value", title=f"cache in {settings.cache_dir}")
    for name, value in stats.rows:
        table.add_row(name, value)
    out.print(table)
    for plot in plots:
        out.print()
        out.print(Text.from_ansi(plot))  # colours on a terminal, plain text in a pipe
    return 0


def _entry_row(entry: object) -> dict[str, object]:
    record = dict(entry.to_record())  # type: ignore[attr-defined]
    record.pop("embedding")
    record.pop("context_embedding")
    return record


def _device_entries(settings: Settings) -> list[tuple[str, "Entry"]]:
    """(cache, entry) of the chat's entries and those `meancache proxy` stored for each
    app, oldest first, read from their stores (no encoder: nothing is embedded)."""
    from meancache.client.device_caches import device_cache_dirs

    found = []
    for namespace, directory in device_cache_dirs(settings):
        with closing(EntryStore(directory)) as store:
            found += [(namespace, entry) for entry in store.entries()]
    found.sort(key=lambda item: item[1].created)
    return found


def cmd_cache_list(args: argparse.Namespace, settings: Settings) -> int:
    """The chat's entries and those `meancache proxy` stored for each app, oldest first."""
    from meancache.client.device_caches import proxy_dir

    found = _device_entries(settings)
    found = found[-args.limit:] if args.limit else found
    if args.json:
        for namespace, entry in found:
            print_json(_entry_row(entry) | {"cache": namespace})
        return 0
    if not found:
        out.print(f"no cached answers yet (the chat's cache is {settings.cache_dir}, "
                  f"`meancache proxy`'s are under {proxy_dir(settings)})")
        return 0
    table = Table("id", "created", "hits", "source", "turn", "asked by", "query")
    from datetime import datetime

    for _, entry in found:
        table.add_row(entry.id[:8], datetime.fromtimestamp(entry.created).strftime("%F %T"),
                      str(entry.hits), str(entry.source), str(entry.turn),
                      entry.asked_by or "chat", entry.query[:80])
    out.print(table)
    return 0


def cmd_cache_clear(args: argparse.Namespace, settings: Settings) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            raise MeanCacheError("refusing to clear the cache without --yes: pass --yes to "
                                 "delete every entry")
        if input(f"Delete every entry in {settings.cache_dir}? [y/N] ").strip().lower() != "y":
            err.print("nothing deleted")
            return 1
    with open_cache(settings) as cache:
        removed = cache.clear()
    out.print(f"deleted {_counted(removed, 'entry', 'entries')}")
    return 0


def cmd_cache_reset_learning(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.learning.state import reset

    with closing(EntryStore(settings.cache_dir)) as store:
        removed = reset(store)
    out.print(f"forgot what the cache learned ({_counted(removed, 'record', 'records')}: "
              "labels, aliases, bound); entries kept")
    return 0


def cmd_cache_export(args: argparse.Namespace, settings: Settings) -> int:
    rows = [json.dumps(_entry_row(entry) | {"cache": namespace}, ensure_ascii=False)
            for namespace, entry in _device_entries(settings)]
    text = "".join(row + "\n" for row in rows)
    if args.file in (None, "-"):
        sys.stdout.write(text)
    else:
        path = Path(args.file)
        try:
            write_atomic(path, text)
        except OSError as exc:
            raise MeanCacheError(f"cannot write {path}: {exc.strerror}") from None
        err.print(f"exported {_counted(len(rows), 'entry', 'entries')} to {path}")
    return 0


def cmd_cache_repair(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.cache_dir.exists():
        raise MeanCacheError(f"there is no cache in {settings.cache_dir}, so nothing to "
                             "repair; check --data-dir (or MEANCACHE_DATA_DIR)")
    done = repair(settings.cache_dir)
    if not done.opened:
        out.print(f"moved the cache to {done.aside}; its database did not open, so nothing "
                  "could be salvaged (it stays there whole); the new cache is empty")
        return 0
    out.print(f"moved the cache to {done.aside}; salvaged "
              f"{_counted(done.entries, 'entry', 'entries')} and "
              f"{_counted(done.records, 'other record', 'other records')} (feedback, "
              "learned labels, thresholds, counters)"
              + (f"; {_counted(done.lost, 'record', 'records')} could not be read and "
                 "stay there" if done.lost else "; every record read"))
    return 0


def cmd_cache_demo(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.demo import run_demo

    with open_cache(settings, settings.data_dir / "demo-cache") as cache:
        run_demo(cache, out)
    return 0


# ask ---------------------------------------------------------------------------------
def _chat_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    return with_upstream(settings, args.upstream, args.api_key, args.model)


def cmd_ask(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.ask import answer_exactly, run_ask
    from meancache.client.chat.conversations import ConversationStore
    from meancache.client.chat.documents import read_document
    from meancache.shared.query import clean_query

    # what can be refused is refused before the encoder, the cache and the upstream load:
    question = clean_query(" ".join(args.question))  # an empty question,
    settings = _chat_settings(args, settings)
    if args.conversation:  # an unknown conversation,
        ConversationStore(settings.conversations_dir).load(args.conversation)
    for path in args.document:  # a file that cannot be attached
        read_document(Path(path))
    if not args.document and answer_exactly(settings, question, args.conversation,
                                            args.json):
        return 0  # an exact pack hit: nothing needed loading
    from meancache.client.chat.session import ChatSession

    assemble_encoder(settings)
    with err.status("loading the cache and the upstream"):
        with ProgressBar("re-embedding cached queries", err) as progress, \
                ProgressBar("embedding the instruction pack", err) as pack_progress:
            session = ChatSession.open(settings, progress, args.start_upstream,
                                       pack_progress=pack_progress)
    if session.upstream_problem is not None:
        err.print(f"[yellow]warning:[/] {escape(session.upstream_problem)}; answering from "
                  "the cache only", highlight=False, soft_wrap=True)
    if session.embedded is not None:  # say what runs, and how it ends
        err.print(escape(session.upstream_label), style="dim", highlight=False,
                  soft_wrap=True)
    run_ask(session, question, args.conversation, args.json,
            [Path(path) for path in args.document])
    return 0


def cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.tui.app import MeanCacheApp

    settings = _chat_settings(args, settings)
    MeanCacheApp(settings, args.start_upstream).run()  # it assembles the encoder itself
    return 0


def cmd_proxy(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.proxy.service import Proxy, listen_warning, own_address_problem
    from meancache.shared.http_limits import listening_socket
    from meancache.shared.processes import exit_on_sigterm

    exit_on_sigterm()  # a service manager's stop closes the caches and upstream as Ctrl+C does
    settings = _chat_settings(args, settings)
    port = settings.proxy_port if args.port is None else args.port
    loop = own_address_problem(settings.upstream_url, args.host, port)
    if loop is not None:
        raise MeanCacheError(loop)
    listener = listening_socket(args.host, port)  # a port in use, before anything loads
    warning = listen_warning(args.host)  # a host it can listen on: it prints
    if warning:
        err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    assemble_encoder(settings)
    with err.status("loading the encoder and checking the upstream"):
        proxy = Proxy.open(settings, args.start_upstream, loopback=warning is None)
    keyless = proxy.state.apps.keyless_warning()
    if keyless:
        err.print(f"[yellow]warning:[/] {escape(keyless)}", highlight=False, soft_wrap=True)
    err.print(f"meancache proxy: serving {escape(proxy.state.model)} on "
              f"http://{args.host}:{port}/v1 (set OPENAI_BASE_URL to it)", highlight=False)
    proxy.serve(listener)
    return 0


# eval --------------------------------------------------------------------------------
VERIFIER_CHOICES = (*VERIFIERS, "none")


def with_verifier(settings: Settings, choice: str | None) -> Settings:
    """``--verifier``: the configured verifier unless the flag names one ("none": off)."""
    if choice is None:
        return settings
    if choice == "none":
        return settings.model_copy(update={"verify_hits": False})
    return settings.model_copy(update={"verify_hits": True, "verifier": choice})


def verifier_name(settings: Settings) -> str:
    return settings.verifier if settings.verify_hits else "none"


def cmd_eval_pairs(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.eval_pairs import evaluate_pairs
    from meancache.shared.pairs import read_pairs

    pairs = read_pairs(Path(args.file), split=args.split, limit=args.limit)
    start, stop, step = args.sweep
    if not (0 <= start < stop <= 1 and step > 0):
        raise MeanCacheError("--sweep takes START STOP STEP with 0 <= START < STOP <= 1")
    sweep = np.round(np.arange(start, stop + step / 2, step), 6)
    settings = with_verifier(settings, args.verifier)
    verified = verifier_name(settings)
    with open_cache(settings) as cache:
        threshold = args.threshold if args.threshold is not None else cache.threshold
        with ProgressBar(f"embedding {len(pairs)} pairs", err) as progress:
            report = evaluate_pairs(pairs, cache.matcher, threshold, sweep, progress)
    if args.json:
        print_json(report.current.as_dict() | {
            "encoder_version": cache.encoder.version,
            "decision": report.decision.as_dict() | {"verifier": verified},
            "sweep": [s.as_dict() for s in report.sweep],
        })
        return 0
    table = Table("decision", "precision", "recall", "F1", "F0.5", "accuracy",
                  title=f"{len(pairs)} pairs from {args.file}")
    whole = f"whole decision (verifier: {verified})"
    rows = [(f"{whole}, tau {report.decision.threshold:.3f}", report.decision, "bold"),
            (f"embedding only, {report.current.threshold:.3f}", report.current, None),
            *((f"embedding only, {s.threshold:.3f}", s, "dim") for s in report.sweep)]
    for label, scores, style in rows:
        table.add_row(label, *(f"{v:.4f}" for v in (scores.precision, scores.recall,
                                                     scores.f1, scores.f05, scores.accuracy)),
                      style=style)
    out.print(table)
    return 0


def cmd_eval_replay(args: argparse.Namespace, settings: Settings) -> int:
    import tempfile

    from meancache.client.eval_replay import replay
    from meancache.shared.pairs import read_pairs

    pairs = read_pairs(Path(args.file), split=args.split, limit=args.limit)
    settings = with_verifier(settings, args.verifier)
    if args.learn:
        return _replay_learning(args, settings, pairs)
    with tempfile.TemporaryDirectory(prefix="meancache-replay-") as directory, \
            open_cache(settings, Path(directory)) as cache, \
            ProgressBar(f"replaying {len(pairs)} pairs", err) as progress:
        report = replay(cache, pairs, progress)
    if args.json:
        print_json(report.as_dict() | {"verifier": verifier_name(settings)})
        return 0
    table = Table("right", "wrong", "miss", "hit precision", "hit rate",
                  title=f"{report.stored} questions stored, {len(pairs)} asked "
                  f"({args.file}; verifier: {verifier_name(settings)})")
    table.add_row(str(report.right), str(report.wrong), str(report.miss),
                  f"{report.hit_precision:.1%}", f"{report.hit_rate:.1%}")
    out.print(table)
    return 0


def _replay_learning(args: argparse.Namespace, settings: Settings, pairs: list) -> int:
    """``eval replay --learn``: the pairs' questions as a seeded stream, the learned
    decision beside the static one (client/eval_stream.py)."""
    import random
    import tempfile

    from meancache.client.eval_stream import replay, stream_of

    turns = stream_of(pairs, args.seed)
    err.print(f"stream of {len(turns)} questions, order seed {args.seed}")
    # the simulated upstream's answer names the stored question it belongs to: a label
    # whatever upstream the settings name
    settings = settings.model_copy(update={"explore_rate": args.explore,
                                           "learn_from_answers": True})
    reports, models = {}, device_models(settings)
    with tempfile.TemporaryDirectory(prefix="meancache-replay-") as directory:
        with open_cache(settings, Path(directory) / "static", models, learns=False) as cache, \
                ProgressBar("static decision", err) as progress:
            reports["static"] = replay(cache, turns, progress).report()
        with open_cache(settings, Path(directory) / "learned", models,
                        rng=random.Random(args.seed)) as cache, \
                ProgressBar("learning decision", err) as progress:
            reports["learned"] = replay(cache, turns, progress).report()
            bound = None if cache.learned.prior is None else cache.learned.bound
            labels = len(cache.learned.labels)
    threshold = None if bound is None else bound.threshold
    closed = bound is not None and bound.closed  # no score served: repeats and aliases only
    if args.json:
        print_json(reports | {"seed": args.seed, "questions": len(turns),
                              "threshold": threshold, "closed": closed, "labels": labels})
        return 0
    table = Table("decision", "part", "right", "wrong", "miss", "hit precision", "hit rate",
                  "at most",
                  title=f"{len(turns)} questions, seed {args.seed}, max_wrong_rate "
                  f"{settings.max_wrong_rate}, learned threshold "
                  + ("none (no learned verifier)" if threshold is None else
                     "none (closed: the labels back no score; cache stats says why)"
                     if closed else f"{threshold:.3f}")
                  + f", {labels} labels learned")
    for name, report in reports.items():
        for part in ("whole", "last_half"):
            r = report[part]
            table.add_row(name, part.replace("_", " "), str(r["right"]), str(r["wrong"]),
                          str(r["miss"]), f"{r['hit_precision']:.1%}", f"{r['hit_rate']:.1%}",
                          f"{r['ceiling']:.1%}")
    out.print(table)
    err.print("at most: the share of questions asked again (in other words), the hit rate of "
              "a cache that answers every repeat rightly; a first question can only miss")
    return 0


# parser ------------------------------------------------------------------------------
def _add_upstream_options(command: argparse.ArgumentParser) -> None:
    """--upstream, --model and --api-key: where chat and ask get answers from."""
    command.add_argument("--upstream", metavar="URL", help="an OpenAI-compatible server, "
                         "with or without /v1 (default: upstream_url in config.toml, else "
                         "OPENAI_BASE_URL, else start the embedded one)")
    command.add_argument("--model", help="the model to ask for (default: upstream_model in "
                         "config.toml; else the first the upstream lists, or the embedded "
                         "builtin:gemma-3-270m)")
    command.add_argument("--api-key", help="bearer key for the upstream (default: "
                         "upstream_api_key in config.toml or MEANCACHE_UPSTREAM_API_KEY; "
                         "OPENAI_API_KEY goes with OPENAI_BASE_URL)")


def add_commands(commands: Any, start_upstream: "UpstreamStarter",
                 start_shared_upstream: "UpstreamStarter") -> None:
    """Register the device's commands; ``start_upstream`` runs the chat's embedded upstream,
    ``start_shared_upstream`` finds (or starts) the one `ask` uses across runs."""
    cache = commands.add_parser("cache", help="inspect and manage the semantic cache")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True)
    stats = cache_commands.add_parser("stats", help="hit rate, entries, threshold, encoder")
    stats.add_argument("--json", action="store_true", help="one JSON object for scripts")
    stats.set_defaults(handler=cmd_cache_stats)
    listing = cache_commands.add_parser("list", help="list cached entries, oldest first")
    listing.add_argument("--limit", type=count(0), default=50,
                         help="the newest N, 0 for all (default: %(default)s)")
    listing.add_argument("--json", action="store_true", help="one JSON object a line")
    listing.set_defaults(handler=cmd_cache_list)
    clear = cache_commands.add_parser("clear", help="delete every entry")
    clear.add_argument("--yes", action="store_true", help="do not ask")
    clear.set_defaults(handler=cmd_cache_clear)
    forget = cache_commands.add_parser("reset-learning", help="forget the learned labels, "
                                       "aliases and error bound (entries stay)")
    forget.set_defaults(handler=cmd_cache_reset_learning)
    export = cache_commands.add_parser(
        "export", help="write the entries (the chat's and each proxied app's) as JSON lines")
    export.add_argument("file", nargs="?", help="output file, - for stdout (default: stdout)")
    export.set_defaults(handler=cmd_cache_export)
    fix = cache_commands.add_parser("repair", help="move a damaged cache aside and salvage it")
    fix.set_defaults(handler=cmd_cache_repair)
    demo = cache_commands.add_parser("demo", help="run the cache end to end on a few questions")
    demo.set_defaults(handler=cmd_cache_demo)

    chat = commands.add_parser("chat", help="the chat app (terminal UI)")
    _add_upstream_options(chat)
    chat.set_defaults(handler=cmd_chat, start_upstream=start_upstream)

    ask = commands.add_parser("ask", help="answer one question (cache, then upstream)")
    ask.add_argument("question", nargs="+", help="the question (its words are joined)")
    ask.add_argument("--conversation", metavar="ID",
                     help="continue this conversation (default: a new one)")
    ask.add_argument("--document", metavar="FILE", action="append", default=[],
                     help="attach a text file to the conversation, as the chat's ctrl+l "
                     "does: the question is answered from it, and a meancache upstream "
                     "keeps it as a module; repeatable (default: none)")
    _add_upstream_options(ask)
    ask.add_argument("--json", action="store_true", help="one JSON object for scripts")
    ask.set_defaults(handler=cmd_ask, start_upstream=start_shared_upstream)

    proxy = commands.add_parser("proxy", help="an OpenAI-compatible caching proxy on "
                                "loopback, for any app (OPENAI_BASE_URL)")
    proxy.add_argument("--port", type=port_argument, help="the port (default: proxy_port in "
                       "config.toml, 8788)")
    proxy.add_argument("--host", default="127.0.0.1", help="the address to listen on "
                       "(default: %(default)s; anything else is reachable from the network)")
    _add_upstream_options(proxy)
    proxy.set_defaults(handler=cmd_proxy, start_upstream=start_upstream)

    evaluate = commands.add_parser("eval", help="measure the cache's match decision")
    eval_commands = evaluate.add_subparsers(dest="eval_command", required=True)
    pairs = eval_commands.add_parser("pairs", help="precision/recall on labelled query pairs")
    pairs.add_argument("file", help="JSONL with q1, q2, label (0/1)")
    pairs.add_argument("--split", help="keep rows whose 'split' field equals this "
                       "(default: every row)")
    pairs.add_argument("--limit", type=count(1), help="use at most N pairs (default: all)")
    pairs.add_argument("--threshold", type=share(),
                       help="the threshold to score (default: the cache's current one)")
    pairs.add_argument("--sweep", type=share(), nargs=3, default=(0.5, 0.95, 0.05),
                       metavar=("START", "STOP", "STEP"),
                       help="thresholds to report too (default: 0.5 0.95 0.05)")
    pairs.add_argument("--json", action="store_true", help="one JSON object for scripts")
    pairs.add_argument("--verifier", choices=VERIFIER_CHOICES,
                       help="the verifier to measure with: rules, learned or none "
                       "(default: the configured one, verifier and verify_hits)")
    pairs.set_defaults(handler=cmd_eval_pairs)
    replaying = eval_commands.add_parser(
        "replay", help="a cache benchmark: store every q1 with its own answer in a fresh "
        "cache, ask every q2; right / wrong / miss")
    replaying.add_argument("file", help="JSONL with q1, q2, label (0/1); a label-0 q2 is "
                           "right only as a miss")
    replaying.add_argument("--split", help="keep rows whose 'split' field equals this "
                           "(default: every row)")
    replaying.add_argument("--limit", type=count(1), help="use at most N pairs (default: all)")
    replaying.add_argument("--json", action="store_true", help="one JSON object for scripts")
    replaying.add_argument("--verifier", choices=VERIFIER_CHOICES,
                           help="the verifier to measure with: rules, learned or none "
                           "(default: the configured one, verifier and verify_hits)")
    replaying.add_argument("--learn", action="store_true", help="replay the questions as a "
                           "stream a user meets: the cache learns its error bound as it goes, "
                           "beside the static decision")
    replaying.add_argument("--seed", type=int, default=0,
                           help="the stream's order, with --learn (default: %(default)s)")
    replaying.add_argument("--explore", type=share(), help="share of near-boundary hits also "
                           "asked upstream, with --learn (default: the judge's own, as "
                           "explore_rate)")
    replaying.set_defaults(handler=cmd_eval_replay)
