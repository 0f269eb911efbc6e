"""The learned verifier at run time: an int8 ONNX cross-encoder scored with onnxruntime,
the probability that two questions are the same question.

The shipped model is package data (``artefact/``): its card (``verifier.json``) names the
file's sha256, the probability threshold chosen on QQP dev, and how it was trained. A file
whose hash differs is refused, never run. Light: numpy, tokenizers and onnxruntime.
"""

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import sha256_file
from meancache.shared.onnx_session import cpu_session
from meancache.shared.verifier.tokens import MAX_TOKENS, tokenize_pairs

ARTEFACT_DIR = Path(__file__).parent / "artefact"
MODEL_FILE = "verifier.onnx"
CARD_FILE = "verifier.json"


@dataclass(frozen=True)
class Card:
    """What a verifier file is: its hash, its threshold, how it was made."""

    sha256: str
    threshold: float  # probability at which a pair counts as "the same question"
    max_tokens: int = MAX_TOKENS
    global_model: str = ""  # a device-made one's: the global model's sha256 it came from
    # a device-made one's: the sha256 of the int8 verifier its global tensors apply over,
    # its card's "base" (the learned decision fitted on that one decides over this one:
    # shared.verifier.decision); a trained one's "base" names its backbone, not a file
    tuned_from: str = ""

    @property
    def judge(self) -> str:
        """Whose scores this verifier gives, by a name every device agrees on: a verifier
        made on a device from a global model goes by that model's sha256 (what the FL
        server signed; the int8 file each device makes need not be byte-identical), any
        other by its file's sha256 (shared.fl.bound_evidence: a pool is one judge's)."""
        return self.global_model or self.sha256


def read_card(directory: Path) -> Card:
    path = directory / CARD_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return Card(str(raw["sha256"]), float(raw["threshold"]),
                    int(raw.get("max_tokens", MAX_TOKENS)), str(raw.get("global_model", "")),
                    str(raw.get("base", "")) if raw.get("global_model") else "")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VerifierError(f"the verifier's card {path} is missing or unreadable ({exc}); "
                            "reinstall meancache or retrain with `meancache verifier "
                            "train`") from None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50.0, 50.0)))


class LearnedVerifier:
    """Scores question pairs; ``threshold`` is where "the same question" begins."""

    def __init__(self, model_path: Path, card: Card) -> None:
        if not model_path.is_file():
            raise VerifierError(f"the verifier model {model_path} is missing; reinstall "
                                "meancache or distil it again with `meancache verifier distil`")
        actual = sha256_file(model_path)
        if actual != card.sha256:
            raise VerifierError(
                f"the verifier model {model_path} has sha256 {actual[:16]}..., not the "
                f"{card.sha256[:16]}... its card names: the file is damaged or was "
                "replaced; it is not loaded. Reinstall meancache or retrain it")
        self.path = model_path
        self.card = card
        self.threshold = card.threshold
        self.version = actual[:16]
        # One thread a pair: a lone pair (about 30 tokens) is too small to share between
        # two (2.3 against 2.9 ms a pair); several candidates are scored side by side
        # instead, one pair per core (onnxruntime's ``run`` may be called from threads).
        self._session = cpu_session(model_path, threads=1)
        self._workers = ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1),
                                           thread_name_prefix="verifier")

    @classmethod
    def load(cls, directory: Path = ARTEFACT_DIR) -> "LearnedVerifier":
        """The verifier in ``directory`` (the shipped one by default), hash checked."""
        return cls(directory / MODEL_FILE, read_card(directory))

    def probabilities(self, query: str, candidates: Sequence[str]) -> np.ndarray:
        """P(same question) of ``query`` with each candidate."""
        return self.pair_probabilities([query] * len(candidates), candidates)

    def pair_probabilities(self, first: Sequence[str], second: Sequence[str]) -> np.ndarray:
        """P(same question) of each ``(first[i], second[i])``, each pair scored alone.

        The int8 model quantises its activations with one scale per call, padding included,
        so a pair scored in a batch would get a probability that depends on the pairs
        beside it (on QQP dev-a by up to 0.29, flipping 70 of 2,022 decisions). Alone, a
        pair's probability is a property of the pair: the threshold chosen on dev holds for
        the lone candidate and for each of five. Unpadded pairs cost about what one padded
        batch did."""
        if len(first) != len(second):
            raise ValueError(f"{len(first)} first questions for {len(second)} second ones")
        pairs = list(zip(first, second, strict=True))
        if len(pairs) == 1:  # no hand-off to a worker for a lone candidate
            return np.array([self._score(pairs[0])], dtype=np.float32)
        return np.fromiter(self._workers.map(self._score, pairs), dtype=np.float32,
                           count=len(pairs))

    def _score(self, pair: tuple[str, str]) -> float:
        tokens = tokenize_pairs([pair[0]], [pair[1]], self.card.max_tokens)
        (logits,) = self._session.run(None, tokens.feeds())
        return float(_sigmoid(np.asarray(logits, dtype=np.float32).reshape(-1))[0])
