"""`meancache upstream ...` commands."""

import argparse
from pathlib import Path
from typing import Any

from meancache.shared.arguments import count, real
from meancache.shared.hosts import port_argument
from meancache.upstream.config import UpstreamSettings
from meancache.upstream.errors import UpstreamError
from meancache.upstream.precision import (
    DEFAULT_KV_FORMAT,
    DEFAULT_PRECISION,
    KV_FORMATS,
    PRECISIONS,
)
from meancache.upstream.sampling_params import SERVER_DEFAULTS, SamplingParams
from meancache.upstream.server.limits import Limits


def add_commands(commands: Any) -> None:
    """Register `upstream serve` on the top-level `meancache` parser."""
    upstream = commands.add_parser("upstream", help="the LLM server with Prompt Cache")
    sub = upstream.add_subparsers(dest="upstream_command", required=True)
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible API")
    serve.add_argument("--model", help="a local Hugging Face model directory, "
                       "builtin:gemma-3-270m (a real model, converted once on first use), "
                       "or an untrained one for tests and benchmarks: builtin:tiny, "
                       "builtin:tiny-gpt2, builtin:tiny-gemma3, builtin:base (~113M) "
                       "(default: upstream_model in config.toml, builtin:gemma-3-270m)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=port_argument, default=8080,
                       help="port to listen on (default: %(default)s)")
    serve.add_argument("--api-key", action="append",
                       help="require 'Authorization: Bearer KEY'; repeat for more keys, each "
                       "a tenant whose schemas the others cannot see (default: "
                       "upstream_api_key in config.toml or MEANCACHE_UPSTREAM_API_KEY; "
                       "none: no key, one tenant)")
    serve.add_argument("--module-budget-mb", type=count(1), default=2048,
                       help="memory for cached module states and prefix blocks "
                       "(default: %(default)s)")
    serve.add_argument("--no-prefix-reuse", dest="prefix_reuse", action="store_false",
                       help="compute every prompt in full instead of reading back the states "
                       "of the longest prefix an earlier request of the same key computed "
                       "(for comparison) (default: off: prefixes are reused)")
    serve.add_argument("--max-body-kb", type=count(1), default=4096,
                       help="largest request body (default: %(default)s)")
    defaults = SERVER_DEFAULTS
    serve.add_argument("--default-max-tokens", type=int, default=defaults.max_tokens,
                       help="max_tokens of a request that sets none (default: %(default)s)")
    serve.add_argument("--repetition-penalty", type=float, default=defaults.repetition_penalty,
                       help="lowers tokens seen among the last --repetition-window tokens; "
                       "1 turns it off, a request's repetition_penalty wins "
                       "(default: %(default)s)")
    serve.add_argument("--repetition-window", type=int, default=defaults.repetition_window,
                       help="tokens the repetition penalty looks back over (default: "
                       "%(default)s)")
    serve.add_argument("--dry-multiplier", type=float, default=defaults.dry_multiplier,
                       help="DRY: how hard a token that would extend an earlier run is "
                       "lowered; 0 turns it off, a request's dry_multiplier wins (default: "
                       "%(default)s)")
    serve.add_argument("--dry-allowed-length", type=int, default=defaults.dry_allowed_length,
                       help="DRY: runs this long repeat freely (default: %(default)s)")
    serve.add_argument("--no-loop-stop", dest="stop_on_loops", action="store_false",
                       help="let answers run on when they repeat one phrase over and over; a "
                       "request's stop_on_loops wins (default: the loop stop is on)")
    limits = Limits()
    for name, default, text in (
        ("max-queued", limits.max_queued, "requests waiting for the model (more get 429)"),
        ("max-queued-per-key", limits.max_queued_per_key,
         "requests one API key may have waiting (the keys take turns)"),
        ("max-prompt-tokens", limits.max_prompt_tokens, "new prompt tokens per request"),
        ("max-completion-tokens", limits.max_tokens, "the largest max_tokens a request may set"),
        ("max-schemas-per-key", limits.max_schemas_per_key, "PML schemas one key may hold"),
        ("max-schema-tokens-per-key", limits.max_schema_tokens_per_key,
         "module tokens of one key's schemas together"),
    ):
        serve.add_argument(f"--{name}", type=count(1), default=default,
                           help=f"{text} (default: %(default)s)")
    serve.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                       help="auto: int4 where the model allows it (Gemma 3), else "
                       "fp16-int8, else float32 (the start line, /v1/models and /metrics "
                       "say which); fp16-int8: float16 layers and an int8 output layer whose "
                       "best words are scored exactly (about 1.6x float32's decode speed "
                       "on a CPU, same next tokens; see benchmarks/generation_speed.py); "
                       "int4: prompts as fp16-int8, decode steps through ONNX Runtime on "
                       "8-bit layers and a 4-bit output layer (Gemma 3 only; as fast as "
                       "llama.cpp's Q4_K_M, next tokens float32's in about 98%% of steps, "
                       "Q4_K_M's 97%%; its decode graph is exported once, about half a "
                       "minute); float32: as loaded "
                       "(default: %(default)s)")
    serve.add_argument("--kv-format", choices=KV_FORMATS, default=DEFAULT_KV_FORMAT,
                       help="how attention states are computed and cached: float16 and "
                       "bfloat16 halve float32's bytes per cached token (each value within "
                       "2^-11 or 2^-8 of it, relative), int8 (a scale per row, each value "
                       "within half a step) quarters them; reuse stays exact in each "
                       "(default: %(default)s)")
    serve.add_argument("--allow-host", action="append", metavar="NAME", type=host_argument,
                       help="also answer requests whose Host header names NAME (repeat for "
                       "more; loopback names are always answered). A server on a network "
                       "address that names none answers any Host (default: none)")
    serve.add_argument("--packs-dir", type=Path, help="publish the newest instruction "
                       "pack (*.mcpack) in this directory at /v1/packs/latest (default: "
                       "none)")
    serve.set_defaults(handler=run_serve)
    background = sub.add_parser(
        "background", help="the embedded upstream in its own process for `meancache ask` "
        "to reuse (ask starts it); exits when idle")
    background.add_argument("--model", help="the model to serve (default: upstream_model in "
                            "config.toml)")
    background.add_argument("--idle-exit", type=real(above=0), default=DEFAULT_IDLE_EXIT_S,
                            metavar="SECONDS", help="exit after this long without a request "
                            f"(default: {DEFAULT_IDLE_EXIT_S:.0f})")
    background.set_defaults(handler=run_background)
    stop = sub.add_parser("stop", help="stop the background upstream `meancache ask` started")
    stop.set_defaults(handler=run_stop)


DEFAULT_IDLE_EXIT_S = 600.0


def run_background(args: argparse.Namespace, settings: UpstreamSettings) -> int:
    from meancache.upstream.server.serve import serve_until_idle

    serve_until_idle(args.model or settings.embedded_model, settings.data_dir, args.idle_exit)
    return 0


def run_stop(args: argparse.Namespace, settings: UpstreamSettings) -> int:
    """Stop the registered background upstream (SIGTERM; it unregisters itself)."""
    import os
    import signal
    import sys
    import time

    from meancache.shared.running_upstream import BACKGROUND, registered, unregister

    running = registered(settings.data_dir)
    if running is None:
        print("no embedded upstream is running", file=sys.stderr)
        return 0
    if running.owner != BACKGROUND:
        raise UpstreamError(f"the embedded upstream at {running.url} is a chat's own (pid "
                            f"{running.pid}): it stops when that chat quits")
    os.kill(running.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while running.alive and time.monotonic() < deadline:
        time.sleep(0.1)
    unregister(settings.data_dir, running.pid)
    print(f"stopped the background upstream ({running.model}, pid {running.pid})",
          file=sys.stderr)
    return 0


# The options that set a request's sampling defaults, by SamplingParams' field.
SAMPLING_OPTIONS = {"max_tokens": "--default-max-tokens",
                    "repetition_penalty": "--repetition-penalty",
                    "repetition_window": "--repetition-window",
                    "dry_multiplier": "--dry-multiplier",
                    "dry_allowed_length": "--dry-allowed-length"}


def sampling_defaults(args: argparse.Namespace) -> SamplingParams:
    """What a request that sets none samples with. SamplingParams alone holds each value's
    range; its error is said with the option's name, before the model loads."""
    try:
        return SamplingParams(max_tokens=args.default_max_tokens,
                              repetition_penalty=args.repetition_penalty,
                              repetition_window=args.repetition_window,
                              stop_on_loops=args.stop_on_loops,
                              dry_multiplier=args.dry_multiplier,
                              dry_allowed_length=args.dry_allowed_length)
    except ValueError as exc:
        field, _, rest = str(exc).partition(" ")
        raise UpstreamError(f"{SAMPLING_OPTIONS.get(field, field)} {rest}") from None


def run_serve(args: argparse.Namespace, settings: UpstreamSettings) -> int:
    defaults = sampling_defaults(args)
    from meancache.upstream.server.app import ServerSettings
    from meancache.upstream.server.serve import serve

    keys = args.api_key or ([settings.upstream_api_key] if settings.upstream_api_key else [])

    serve(
        model=args.model or settings.embedded_model,
        host=args.host,
        port=args.port,
        settings=ServerSettings(
            api_key=keys[0] if keys else None,
            api_keys=tuple(keys[1:]),
            max_body_bytes=args.max_body_kb * 1024,
            defaults=defaults,
            limits=Limits(
                max_queued=args.max_queued, max_queued_per_key=args.max_queued_per_key,
                max_prompt_tokens=args.max_prompt_tokens,
                max_tokens=args.max_completion_tokens,
                max_schemas_per_key=args.max_schemas_per_key,
                max_schema_tokens_per_key=args.max_schema_tokens_per_key,
            ),
            packs_dir=args.packs_dir,
            allowed_hosts=allowed_hosts(args.allow_host),
        ),
        module_budget_bytes=args.module_budget_mb * 1024 * 1024,
        prefix_reuse=args.prefix_reuse,
        kv_format=args.kv_format,
        data_dir=settings.data_dir,
        precision=args.precision,
    )
    return 0



def host_argument(value: str) -> str:
    """An --allow-host name: a host as a Host header carries it, without a port."""
    from meancache.shared.hosts import host_name

    name = host_name(value)
    if name is None or name != value.lower():
        raise argparse.ArgumentTypeError(f"a host name without a port, not {value[:80]!r}")
    return name


def allowed_hosts(names: list[str] | None) -> frozenset[str] | None:
    """The Host names a served API answers: the loopback ones and ``names``, or None (any)
    when none are named (serve() then keeps a loopback server to the loopback names)."""
    from meancache.shared.hosts import LOOPBACK_NAMES

    return LOOPBACK_NAMES | set(names) if names else None
