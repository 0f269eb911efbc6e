"""llama.cpp through the prebuilt ``llama-cpp-py-sync`` wheel (CFFI over llama.h), for the
benchmarks: one sequence, greedy, with the logits of every step, fed the very token ids the
torch engine reads, so that speed and next-token agreement compare the same text.

The wheel's CPU build is tagged manylinux2014 but its libraries need glibc 2.38 (they call
``__isoc23_strtol`` and friends): on an older system (Debian 12 has 2.36) it does not load,
and :func:`open_llama` raises ImportError with the loader's message.
"""

from pathlib import Path

import numpy as np


class LlamaSession:
    """A llama.cpp model and context with one sequence (id 0) and its KV cache."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int = 2048) -> None:
        from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

        self.ffi, self.lib = get_ffi(), get_lib()
        self.lib.llama_backend_init()
        self._quiet = self.ffi.callback("void(enum ggml_log_level, const char *, void *)",
                                        lambda level, text, data: None)
        self.lib.llama_log_set(self._quiet, self.ffi.NULL)  # its logs go per graph to stderr
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = self.lib.llama_model_load_from_file(str(gguf).encode(), params)
        if self.model == self.ffi.NULL:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        ctx = self.lib.llama_context_default_params()
        ctx.n_ctx, ctx.n_batch, ctx.n_ubatch = n_ctx, 512, 512
        ctx.n_threads = ctx.n_threads_batch = threads
        self.ctx = self.lib.llama_init_from_model(self.model, ctx)
        self.memory = self.lib.llama_get_memory(self.ctx)
        self.n_vocab = self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(self.model))

    def _decode(self, tokens: list[int], start: int) -> np.ndarray:
        """Logits after reading ``tokens`` at positions ``start`` on."""
        for offset in range(0, len(tokens), 512):  # llama_decode aborts past n_batch
            chunk = tokens[offset:offset + 512]
            batch = self.lib.llama_batch_init(len(chunk), 0, 1)
            try:
                batch.n_tokens = len(chunk)
                for i, token in enumerate(chunk):
                    batch.token[i], batch.pos[i] = token, start + offset + i
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                    batch.logits[i] = int(i == len(chunk) - 1)
                if self.lib.llama_decode(self.ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
            finally:
                self.lib.llama_batch_free(batch)
        pointer = self.lib.llama_get_logits_ith(self.ctx, -1)
        return np.frombuffer(self.ffi.buffer(pointer, self.n_vocab * 4), np.float32).copy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Logits after ``ids`` read from position 0, the cache cleared first."""
        self.lib.llama_memory_clear(self.memory, True)
        return self._decode(ids, 0)

    def step(self, token: int, position: int) -> np.ndarray:
        return self._decode([token], position)


class LlamaSlot:
    """One sequence reused across prompts as llama.cpp's server reuses a slot's KV cache
    (``cache_prompt``): a prompt reads only what follows the longest prefix of token ids it
    shares with the slot's previous prompt (at least its last token, whose logits it needs)."""

    def __init__(self, session: LlamaSession) -> None:
        self.session, self.ids = session, []

    def first_logits(self, ids: list[int]) -> tuple[np.ndarray, int]:
        """The logits after ``ids``, and how many of its tokens were read back."""
        common = 0
        for a, b in zip(self.ids, ids, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)
        session = self.session
        session.lib.llama_memory_seq_rm(session.memory, 0, common, -1)
        logits = session._decode(ids[common:], common)
        self.ids = list(ids)
        return logits, common


def open_llama(gguf: Path, threads: int) -> LlamaSession:
    """A session, or ImportError naming why the wheel is unusable here."""
    try:
        return LlamaSession(gguf, threads)
    except (ImportError, RuntimeError, OSError) as exc:
        raise ImportError(f"llama-cpp-py-sync is not usable here: {exc}") from exc
