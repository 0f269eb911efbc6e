"""Load the causal LM the server runs: a local Hugging Face directory or a built-in one."""

import ctypes
import gc
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from meancache.shared.progress import Progress
from meancache.upstream.builtin import (
    BUILTIN_MODELS,
    CHAT_TEMPLATE,
    builtin_model,
    builtin_tokenizer,
)
from meancache.upstream.errors import ModelLoadError, UnsupportedModelError
from meancache.upstream.gemma import STOP as GEMMA_STOP
from meancache.upstream.gemma import load_gemma
from meancache.upstream.precision import apply_precision, check_precision, choose_precision
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

if TYPE_CHECKING:
    from meancache.upstream.onnx_decode import OnnxDecoder

log = logging.getLogger(__name__)

# Architectures whose position handling (rotary or learned absolute) Prompt Cache supports.
SUPPORTED_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "gpt2", "gemma3_text"})
GEMMA = "builtin:gemma-3-270m"  # a real model, shipped in pip packages (upstream.gemma)
DEFAULT_MODEL = GEMMA


@dataclass(frozen=True)
class LoadedModel:
    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    architecture: str
    untrained: bool  # a built-in random-init model: its text is meaningless
    stop: tuple[str, ...] = ()  # where the model starts a turn its template does not end
    decoder: "OnnxDecoder | None" = None  # runs decode steps instead of the model (int4)
    precision: str = "float32"  # as served: what `auto` chose, if asked (upstream.precision)
    # Counted as loaded: the packed float16/int8 weights a precision installs are not
    # torch parameters (upstream.compact_weights).
    parameters: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", sum(p.numel() for p in self.model.parameters()))

    @property
    def context_length(self) -> int:
        config = self.model.config
        return int(getattr(config, "max_position_embeddings", None)
                   or getattr(config, "n_positions", 2048))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_model(spec: str = DEFAULT_MODEL, device: str | None = None,
               data_dir: Path | None = None, progress: Progress | None = None,
               precision: str = "float32") -> LoadedModel:
    """``builtin:NAME`` (tiny, tiny-gpt2, tiny-gemma3, base, gemma-3-270m) or a local model
    directory, served in ``precision`` (upstream.precision). ``builtin:gemma-3-270m`` keeps
    its converted weights under ``data_dir``, and int4 its decode graph; ``progress`` hears
    (done, total) of the weights' one-time conversion."""
    check_precision(precision)
    loaded = _load(spec, device or ("cuda" if torch.cuda.is_available() else "cpu"),
                   data_dir, progress)
    precision = choose_precision(loaded.model, precision)
    decoder = None
    if precision == "int4":  # exported from the float32 weights, before they are compacted
        from meancache.upstream.decode_graph_cache import graph_dir
        from meancache.upstream.onnx_decode import onnx_decoder

        decoder = onnx_decoder(loaded.model, cache_dir=None if data_dir is None
                               else graph_dir(data_dir))
    loaded = replace(loaded, decoder=decoder, precision=precision)  # counted before packing
    apply_precision(loaded.model, precision)
    _release_freed_heap()
    return loaded


def _release_freed_heap() -> None:
    """Give the C heap's freed pages back to the system. The float32 weights a model is
    loaded in, once packed into another precision (and an int4 graph's export), leave
    hundreds of MB freed but resident that glibc's allocator keeps for later: 675 MB of
    Gemma 3 270M's 2,091 MB in fp16-int8, 712 MB in int4 (docs/upstream.md). A C library
    without ``malloc_trim`` has nothing to call."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return
    trim(0)


def _load(spec: str, device: str, data_dir: Path | None, progress: Progress | None
          ) -> LoadedModel:
    if spec == GEMMA:
        if data_dir is None:
            raise ModelLoadError(f"{GEMMA} needs a data directory to keep its converted "
                                 "weights in")
        model, tokenizer = load_gemma(data_dir, device, progress)
        return LoadedModel(spec, model, tokenizer, model.config.model_type, False, GEMMA_STOP)
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN_MODELS:
            raise ModelLoadError(
                f"unknown built-in model {name!r}; choose one of "
                + ", ".join([*(f"builtin:{n}" for n in BUILTIN_MODELS), GEMMA])
            )
        model = builtin_model(name).to(device)
        loaded = LoadedModel(spec, model, builtin_tokenizer(), model.config.model_type, True)
        log.warning("serving %s: a randomly initialised %s model with %.1fM parameters; "
                    "its text is meaningless (an untrained demo model)",
                    spec, loaded.architecture, loaded.parameters / 1e6)
        return loaded
    return _load_directory(Path(spec).expanduser(), device)


def _load_directory(path: Path, device: str) -> LoadedModel:
    if not path.is_dir():
        raise ModelLoadError(
            f"model {str(path)!r} is not a local directory; the server never downloads "
            "models. Pass a directory holding config.json and the weights, or builtin:tiny"
        )
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} holds no usable model config: {exc}; pass a Hugging Face "
                             "model directory with config.json, or builtin:tiny") from None
    if config.model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path} is a {config.model_type!r} model; Prompt Cache supports "
            + ", ".join(sorted(SUPPORTED_ARCHITECTURES)) + "; serve a model of one of those"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32
        ).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load the model in {path}: {exc}; check that its weight "
                             "and tokenizer files are complete") from None
    if tokenizer.chat_template is None:
        log.warning("%s has no chat template; role tags use meancache's plain one", path)
        tokenizer.chat_template = CHAT_TEMPLATE
    return LoadedModel(str(path), model, tokenizer, config.model_type, False)
