"""The encoder's tokenizer, without transformers: the ``tokenizers`` pipeline that the
model's Hugging Face tokenizer wraps, with the padding and truncation that tokenizer applies
when called with ``padding=True, truncation=True, max_length=...``.

One class for both of the encoder's paths: the PyTorch model hands over its tokenizer
(``of_model_tokenizer``), and a checked ONNX export carries the same pipeline as JSON
(``from_record``), so a lookup started from the export tokenises exactly as the model it
was exported from, without importing torch or transformers (about 2 s of a start).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from meancache.shared.errors import EncoderError
from tokenizers import Tokenizer


@dataclass(frozen=True)
class Tokenized:
    input_ids: np.ndarray
    attention_mask: np.ndarray


class EncoderTokenizer:
    """Pads each batch to its longest text and cuts every text at ``max_tokens``."""

    def __init__(self, pipeline_json: str, max_tokens: int, pad_id: int, pad_token: str,
                 pad_type_id: int = 0, padding_side: str = "right",
                 truncation_side: str = "right") -> None:
        self.max_tokens = max_tokens
        self._record = {"pipeline": pipeline_json, "max_tokens": max_tokens, "pad_id": pad_id,
                        "pad_token": pad_token, "pad_type_id": pad_type_id,
                        "padding_side": padding_side, "truncation_side": truncation_side}
        # Two copies: one configured for batches, one for counting; neither changes later,
        # so threads can share them.
        self._batch = Tokenizer.from_str(pipeline_json)
        self._batch.enable_truncation(max_length=max_tokens, stride=0,
                                      strategy="longest_first", direction=truncation_side)
        self._batch.enable_padding(direction=padding_side, pad_id=pad_id,
                                   pad_type_id=pad_type_id, pad_token=pad_token)
        self._whole = Tokenizer.from_str(pipeline_json)
        self._whole.no_truncation()
        self._whole.no_padding()

    @classmethod
    def of_model_tokenizer(cls, tokenizer: Any, max_tokens: int) -> "EncoderTokenizer":
        """From a Hugging Face fast tokenizer (a sentence-transformers model's)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer) or tokenizer.pad_token_id is None:
            raise EncoderError(f"the encoder's tokenizer ({type(tokenizer).__name__}) is not "
                               "a fast tokenizer with a padding token; use a "
                               "sentence-transformers model that ships tokenizer.json")
        return cls(backend.to_str(), max_tokens, int(tokenizer.pad_token_id),
                   str(tokenizer.pad_token), int(tokenizer.pad_token_type_id),
                   str(tokenizer.padding_side), str(tokenizer.truncation_side))

    def record(self) -> dict[str, Any]:
        """What ``from_record`` rebuilds this tokenizer from (JSON-safe)."""
        return dict(self._record)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "EncoderTokenizer":
        return cls(str(record["pipeline"]), int(record["max_tokens"]), int(record["pad_id"]),
                   str(record["pad_token"]), int(record["pad_type_id"]),
                   str(record["padding_side"]), str(record["truncation_side"]))

    def batch(self, texts: Sequence[str]) -> Tokenized:
        """Model inputs for ``texts``, padded to the longest, each cut at ``max_tokens``."""
        encoded = self._batch.encode_batch(list(texts))
        shape = (len(encoded), -1)  # (0, 0) for no texts
        return Tokenized(np.array([e.ids for e in encoded], np.int64).reshape(shape),
                         np.array([e.attention_mask for e in encoded], np.int64).reshape(shape))

    def count(self, text: str) -> int:
        """Tokens in ``text`` with the model's special tokens, uncut."""
        return len(self._whole.encode(text).ids)
