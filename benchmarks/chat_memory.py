"""Resident memory of the chat with both real models loaded, step by step.

Opens a chat session the way `meancache chat` does (the configured encoder on
onnxruntime, the cache, the embedded upstream with its default model) in this process and
reads the resident set size after each step, then after one answer. Models are assembled
and converted once into --cache-dir (as `meancache chat` does into the user's data dir; a
first run takes minutes).

    python benchmarks/chat_memory.py                       # MPNet + Gemma 3 270M
    python benchmarks/chat_memory.py --encoder minilm
    python benchmarks/chat_memory.py --precision float32   # the upstream in another precision
"""

import asyncio
import os
import tempfile
import time
from pathlib import Path

from _common import base_parser, heading, make_table, note, print_command, print_table
from meancache.upstream.precision import DEFAULT_PRECISION, PRECISIONS

TARGET_MB = 2.5 * 1024


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident set size (Linux /proc), or with ``VmHWM`` its highest yet."""
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc: this benchmark needs Linux")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--encoder", default="mpnet", help="encoder profile or directory")
    parser.add_argument("--model", default="builtin:gemma-3-270m", help="upstream model")
    parser.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                        help="the embedded upstream's precision (the chat's default)")
    args = parser.parse_args()

    from meancache.client.cache import SemanticCache
    from meancache.client.chat.answering import AnswerService
    from meancache.client.chat.conversations import Conversation, ConversationStore
    from meancache.client.config import load_settings
    from meancache.client.encoder import load_device_encoder
    from meancache.client.upstream_client import UpstreamClient
    from meancache.shared.encoder import locate_model

    from meancache.embedded import start_embedded_upstream

    settings = load_settings()
    data_dir = args.cache_dir
    scratch = Path(tempfile.mkdtemp(prefix="meancache-memory-"))
    settings = settings.model_copy(update=dict(data_dir=data_dir, encoder_model=args.encoder,
                                               upstream_model=args.model))
    steps: list[tuple[str, float, float]] = [("python, imports", rss_mb(), 0.0)]

    def step(label: str, start: float) -> None:
        steps.append((label, rss_mb(), time.perf_counter() - start))

    start = time.perf_counter()
    locate_model(settings.encoder_model, settings.models_dir)
    encoder = load_device_encoder(settings)
    step(f"encoder {args.encoder} ({encoder.backend})", start)
    start = time.perf_counter()
    cache = SemanticCache(scratch / "cache", encoder, settings.cache_settings())
    step("cache (empty)", start)
    start = time.perf_counter()
    embedded = start_embedded_upstream(settings.upstream_model, data_dir,
                                       precision=args.precision)
    step(f"embedded upstream {embedded.label}", start)
    answers = AnswerService(cache, UpstreamClient(embedded.url, embedded.api_key),
                            ConversationStore(scratch / "conversations"), 32, 0.0)

    async def ask() -> str:
        turn = await answers.answer(Conversation(), "What is the capital of France?")
        await answers.upstream.aclose()
        return turn.answer

    start = time.perf_counter()
    answer = asyncio.run(ask())
    step("after one answer", start)
    embedded.stop()
    cache.close()

    heading(f"Chat resident memory, upstream in {args.precision} (target <= {TARGET_MB:.0f} MB)")
    table = make_table(["step", "RSS MB", "step adds MB", "seconds"])
    previous = 0.0
    for label, mb, seconds in steps:
        table.add_row(label, f"{mb:.0f}", f"{mb - previous:+.0f}", f"{seconds:.1f}")
        previous = mb
    print_table(table)
    peak = max(mb for _, mb, _ in steps)
    note(f"peak {peak:.0f} MB: {'meets' if peak <= TARGET_MB else 'misses'} the target; "
         f"high-water mark {rss_mb('VmHWM'):.0f} MB (while loading, before the freed "
         f"heap is handed back); answer: {answer[:60]!r}")
    print_command()


if __name__ == "__main__":
    main()
