"""Time to first token: full prefill vs Prompt Cache module reuse.

A schema holds one module of N tokens; a prompt imports it and asks a 16-token
question. Full prefill computes all N + 16 tokens; Prompt Cache reuses the module's
precomputed states and computes only the question; the question alone (the same new
tokens after the leading BOS, no module) is what the cached path is measured against.
Prefix reuse is off, so that every full prefill computes every token. Model: the built-in
random-init Llama-architecture `builtin:base` (~113M parameters) by default (timing does
not depend on weight values), in the precision and KV format `upstream serve` uses by
default. Runs interleave the three prompts; warm-up runs are excluded; medians are
reported. Also the cost of encoding the schema once and the memory per cached token.

    python benchmarks/prompt_cache_ttft.py            # 512, 1K, 2K, 4K tokens, 3 runs each
    python benchmarks/prompt_cache_ttft.py --quick    # builtin:tiny, small sizes
    python benchmarks/prompt_cache_ttft.py --model builtin:gemma-3-270m   # the real Gemma 3
    python benchmarks/prompt_cache_ttft.py --plot docs/prompt_cache_ttft.png  # and a chart
"""

import statistics
import time

import torch
from _common import (
    apply_defaults,
    base_parser,
    heading,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
)
from _plot import add_plot_option, line_chart
from meancache.client.config import load_settings
from meancache.upstream.model_loading import load_model
from meancache.upstream.precision import (
    DEFAULT_KV_FORMAT,
    DEFAULT_PRECISION,
    KV_FORMATS,
    PRECISIONS,
)
from meancache.upstream.prompt_cache.engine import Finish, PreparedPrompt, PromptCacheEngine
from meancache.upstream.prompt_cache.layout import LEADING
from meancache.upstream.sampling import SamplingParams

QUESTION_TOKENS = 16
GREEDY_ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)


def ttft(engine: PromptCacheEngine, prepared: PreparedPrompt, clock: str = "wall") -> float:
    """Seconds to the first token: by the wall clock (what a user waits), or as this
    process's CPU time, which other processes' load does not inflate (with one thread, it
    is what the wall clock gives on a quiet machine)."""
    start = time.process_time()
    finish = [e for e in engine.generate(prepared, GREEDY_ONE_TOKEN) if isinstance(e, Finish)]
    return finish[0].ttft_seconds if clock == "wall" else time.process_time() - start


def module_text(engine: PromptCacheEngine, tokens: int) -> str:
    """Filler of about ``tokens`` tokens for the model's tokenizer (exactly, byte-level)."""
    sentence = "The river runs under seven bridges before it reaches the sea. "
    ids = engine.tokenizer.encode(sentence * tokens, add_special_tokens=False)[:tokens]
    return str(engine.tokenizer.decode(ids))


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="builtin:base (default) or a local model directory")
    parser.add_argument("--lengths", type=int, nargs="+", help="module lengths in tokens")
    parser.add_argument("--runs", type=int, help="timed runs per cell (after one warm-up)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION)
    parser.add_argument("--kv-format", choices=KV_FORMATS, default=DEFAULT_KV_FORMAT)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: time to first token as a user waits; cpu: this "
                             "process's CPU time (for a loaded machine, with --threads 1)")
    add_plot_option(parser)
    args = apply_defaults(parser.parse_args(),
                          {"model": "builtin:base", "lengths": [512, 1024, 2048, 4096],
                           "runs": 3},
                          {"model": "builtin:tiny", "lengths": [128, 256], "runs": 2})
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, device="cpu", data_dir=load_settings().data_dir,
                        precision=args.precision)
    engine = PromptCacheEngine(loaded, prefix_reuse=False, kv_format=args.kv_format)
    note(f"{loaded.name}: {loaded.parameters / 1e6:.1f}M parameters, {loaded.architecture}")
    question = module_text(engine, QUESTION_TOKENS)

    full_curve: list[float] = []
    cached_curve: list[float] = []
    table = make_table(["module tokens", "full prefill TTFT (ms)", "Prompt Cache TTFT (ms)",
                        "speed-up", "question alone TTFT (ms)", "cached / alone",
                        "schema encode (ms)", "cached tokens", "module MiB"])
    for length in args.lengths:
        info = engine.add_schema(f'<schema name="s{length}"><module name="doc">'
                                 f"{module_text(engine, length)}</module></schema>")
        cached = engine.prepare_pml_source(
            f'<prompt schema="s{length}"><doc/>{question}</prompt>')
        layout = engine.layouts[f"s{length}"]
        ids = [t for seg in layout.segments.values() for t in seg.token_ids] + list(
            cached.new_ids)
        full = PreparedPrompt((), tuple(ids), tuple(range(len(ids))))
        alone_ids = layout.segments[LEADING].token_ids + list(cached.new_ids)
        alone = PreparedPrompt((), tuple(alone_ids), tuple(range(len(alone_ids))))
        assert len(cached.new_ids) <= QUESTION_TOKENS + 8, cached.new_ids  # + generation prefix
        for prepared in (full, cached, alone):  # warm-up
            ttft(engine, prepared, args.clock)
        full_times, cached_times, alone_times = [], [], []
        for run in range(args.runs):
            note(f"{length} tokens, run {run + 1}/{args.runs}")
            full_times.append(ttft(engine, full, args.clock))
            cached_times.append(ttft(engine, cached, args.clock))
            alone_times.append(ttft(engine, alone, args.clock))
        full_ms = statistics.median(full_times) * 1000
        cached_ms = statistics.median(cached_times) * 1000
        alone_ms = statistics.median(alone_times) * 1000
        full_curve.append(full_ms)
        cached_curve.append(cached_ms)
        table.add_row(str(length), f"{full_ms:.1f}", f"{cached_ms:.1f}",
                      f"{full_ms / cached_ms:.1f}x", f"{alone_ms:.1f}",
                      f"{cached_ms / alone_ms:.2f}", f"{info.encode_seconds * 1000:.1f}",
                      str(info.cached_tokens), f"{info.nbytes / 2**20:.1f}")
        engine.remove_schema(f"s{length}")

    setup = (f"{loaded.name} ({loaded.parameters / 1e6:.1f}M parameters, {args.precision}, "
             f"KV {args.kv_format}, CPU, {args.threads} threads, {args.clock} clock), "
             f"{QUESTION_TOKENS}-token question, median of "
             f"{args.runs} runs after a warm-up")
    heading(f"Time to first token, {setup}")
    print_table(table)
    if args.plot:
        line_chart(args.plot, "Time to first token: full prefill vs Prompt Cache module reuse",
                   f"module length (tokens; the question adds {QUESTION_TOKENS})",
                   "time to first token (ms)",
                   {"full prefill": (args.lengths, full_curve),
                    "Prompt Cache (module states reused)": (args.lengths, cached_curve)},
                   subtitle=f"{setup}; {machine_load()}", log_x=True, log_y=True)
    config = loaded.model.config
    heading(
        f"memory per cached token: {engine.bytes_per_token} bytes = 2 x "
        f"{config.num_hidden_layers} layers x {config.num_key_value_heads} kv heads x "
        f"{getattr(config, 'head_dim', None) or config.hidden_size // config.num_attention_heads}"
        f" head dim x the bytes of a {args.kv_format} element (float32: 4)"
        if loaded.architecture != "gpt2" else
        f"memory per cached token: {engine.bytes_per_token} bytes"
    )
    print_command()
    note(machine_load())


if __name__ == "__main__":
    main()
