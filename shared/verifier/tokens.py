"""The verifier's input: a question pair as one BERT sequence, ``[CLS] q1 [SEP] q2 [SEP]``,
tokenised by the packaged all-MiniLM-L6-v2's own tokenizer (nothing is downloaded), or by
another backbone's ``tokenizer.json`` (the teacher's MPNet: ``<s> q1 </s></s> q2 </s>``).

Training and the client use this one function, so the model sees at run time exactly the
inputs it was trained on. Light: the ``tokenizers`` library only, no torch.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from meancache.shared.encoder import packaged_minilm_dir

MAX_TOKENS = 64  # both questions together; QQP pairs are ~30 tokens, longer ones are cut


@dataclass(frozen=True)
class PairBatch:
    input_ids: np.ndarray  # (n, length) int64
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    def feeds(self) -> dict[str, np.ndarray]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "token_type_ids": self.token_type_ids}


@lru_cache(maxsize=4)
def _tokenizer(path: Path, max_tokens: int) -> object:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_tokens, strategy="longest_first")
    pad = tokenizer.padding or {"pad_id": 0, "pad_token": "[PAD]"}  # the file's own pad
    tokenizer.enable_padding(pad_id=pad["pad_id"], pad_token=pad["pad_token"])  # to the longest
    return tokenizer


def tokenize_pairs(first: Sequence[str], second: Sequence[str],
                   max_tokens: int = MAX_TOKENS, tokenizer_file: Path | None = None
                   ) -> PairBatch:
    """Each ``first[i]`` paired with ``second[i]``, padded to the longest pair only;
    MiniLM's tokenizer unless ``tokenizer_file`` names another."""
    if len(first) != len(second):
        raise ValueError(f"{len(first)} first questions for {len(second)} second ones")
    tokenizer = _tokenizer(tokenizer_file or packaged_minilm_dir() / "tokenizer.json",
                           max_tokens)
    encoded = tokenizer.encode_batch(list(zip(first, second, strict=True)))
    return PairBatch(np.array([e.ids for e in encoded], dtype=np.int64),
                     np.array([e.attention_mask for e in encoded], dtype=np.int64),
                     np.array([e.type_ids for e in encoded], dtype=np.int64))
