"""Labels without a person: whether the upstream's fresh answer to a question agrees with
the answer a candidate entry holds (at temperature 0 the same question gets the same
answer, so agreement says the two questions were the same).

Short answers (a number, a name, "100°C") agree only when equal once normalised: two
different short answers embed close together. Longer ones agree when the encoder's
cosine of the two reaches ``threshold``; ``benchmarks/learning_stream.py`` chooses that
threshold on answer pairs it generates and reports the comparison's accuracy.
"""

from collections.abc import Callable, Sequence

import numpy as np
from meancache.shared.query import normalise_query

SHORT_WORDS = 6  # answers of at most this many words are compared exactly
# Answer cosine from which two long answers agree: the most accurate on the answer pairs
# benchmarks/learning_stream.py generates (MiniLM: 100% at 0.75, 95.5% at 0.8, 85.8% at 0.9).
# On real answers (benchmarks/answer_agreement.py: Gemma 3 270M int4, greedy, 60 QQP dev
# duplicates against 60 in-band non-duplicates) no threshold separates them: with MPNet
# onnx-int8, test-half accuracy 57-64% from 0.6 to 0.95 (60.6% here: agree on 44% of same,
# 24% of different questions), because the model answers rephrasings differently; so
# this value stays, and such labels are noisy (docs/error-bound-measured.md).
AGREE_AT = 0.75

Embed = Callable[[Sequence[str]], np.ndarray]  # texts -> unit vectors, one row each


def normalised(answer: str) -> str:
    return normalise_query(answer).rstrip(".!")


def is_short(answer: str) -> bool:
    return len(answer.split()) <= SHORT_WORDS


def agree(fresh: str, cached: str, embed: Embed, threshold: float = AGREE_AT) -> bool:
    """Whether ``fresh`` and ``cached`` answer the same question."""
    if normalised(fresh) == normalised(cached):
        return True
    if is_short(fresh) or is_short(cached):
        return False
    a, b = embed([fresh, cached])
    return float(np.dot(a, b)) >= threshold
