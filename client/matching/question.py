"""A question as it travels down the answer path, and as a source offers its stored ones.

``Query`` is cleaned once, where a question enters (``Query.of``: the answer service, a
direct call to the cache); every source, the cache's lookup and insert, and the turn get
the same one, so ``clean_query`` runs once per question. ``Question`` is the query as a
decision compares it (normalised key, vector in the current space); ``Candidate`` a stored
question a source offers to the ``Matcher``; ``Match`` and ``NoMatch`` what it decided.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from meancache.client.learning.bound import Weighed
from meancache.client.matching import entry_threshold
from meancache.shared.encoder import Encoder
from meancache.shared.progress import Progress
from meancache.shared.query import clean_query, embedding_text

NOTHING_CLOSE = "no cached query is similar enough"


@dataclass(frozen=True)
class Query:
    """A cleaned question. Build one with ``of``; ``Query(text)`` itself is for a text
    cleaned when it was first asked (a turn's question, the question a follow-up follows)."""

    text: str

    @classmethod
    def of(cls, text: "str | bytes | Query") -> "Query":
        """``text`` cleaned (``clean_query``: InvalidQueryError names what is wrong), or
        as given if it is a Query already."""
        return text if isinstance(text, Query) else cls(clean_query(text))


@dataclass(frozen=True)
class Question:
    """A question as every source compares it."""

    text: str  # cleaned (``clean_query``): what the verifier reads
    key: str  # normalised: what is embedded, and "the same question"
    vector: np.ndarray
    truncated: bool  # past the encoder's window


@dataclass(frozen=True)
class Candidate:
    """A stored question a source offers, with what its threshold depends on."""

    key: str  # the source's own id (a cache entry id, a pack instruction)
    text: str  # the stored question
    similarity: float
    evidence: entry_threshold.Evidence | None = None  # None: held to tau


@dataclass(frozen=True)
class Match:
    candidate: Candidate
    # the judge's score of the pick (Matcher.judge: the learned decision's, the verifier's
    # probability or the cosine); None where nothing judged it (exploration needs one)
    score: float | None = None
    weighed: Weighed = ()  # the candidates the verifier weighed against the pick


@dataclass(frozen=True)
class NoMatch:
    reason: str
    best_similarity: float | None = None
    # A near match the verifier declined: the reason without its detail (the question's
    # words, a probability), which is what declines are counted by. None: not a veto.
    veto_kind: str | None = None
    # The verifier's most probable candidate and the judge's score of it where it fell under
    # the threshold: after the upstream answers, the two answers label the pair
    # (client/learning).
    judged: tuple[str, float] | None = None
    weighed: Weighed = ()  # the candidates the verifier weighed, the declined pick among them

    @property
    def vetoed(self) -> bool:
        return self.veto_kind is not None


def embed_texts(encoder: Encoder, texts: Sequence[str], progress: Progress | None = None
                ) -> np.ndarray:
    """Questions embedded as every match embeds them (``embedding_text``)."""
    return encoder.encode([embedding_text(t) for t in texts], progress=progress)
