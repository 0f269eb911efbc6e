"""One cached exchange, and how it is stored.

Records are plain dicts of builtins and bytes (never pickled classes), so a refactor of
this module can never make an old cache unreadable.
"""

import time
import uuid
from dataclasses import dataclass, field, replace

import numpy as np
from meancache.client.matching.origins import Source
from meancache.client.matching.question import Query

# Stored vectors are float16: a PCA-64 vector is 128 bytes, 92% below 384 float32 values.
STORED_DTYPE = np.float16


@dataclass(frozen=True)
class Context:
    """Where a query sits in its conversation: the previous turn, if any."""

    conversation_id: str | None = None
    turn: int = 0
    prev_entry_id: str | None = None
    prev_query: "str | Query | None" = None  # a Query: cleaned when it was asked

    @property
    def is_follow_up(self) -> bool:
        return self.prev_query is not None


@dataclass(frozen=True)
class Entry:
    query: str
    answer: str
    embedding: np.ndarray  # unit vector in the space of ``encoder_version``, STORED_DTYPE
    encoder_version: str
    context_query: str | None = None  # the previous turn's query: kept to re-embed it
    context_embedding: np.ndarray | None = None
    conversation_id: str | None = None
    turn: int = 0
    prev_id: str | None = None
    source: Source = Source.UPSTREAM
    query_tokens: int = 0
    answer_tokens: int = 0
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)
    last_hit: float | None = None
    hits: int = 0
    rejections: int = 0
    # What feedback taught about this entry's own threshold (client/matching/entry_threshold.py)
    threshold_evidence: dict[str, object] | None = None
    asked_by: str | None = None  # the app that asked through `meancache proxy` (None: the chat)
    # Rejected in another context although the same question: answers only in its own
    # (client/cache/context.py)
    context_bound: bool = False

    @property
    def nbytes(self) -> int:
        """Approximate stored size: texts, vectors and a fixed overhead for the record."""
        ctx = self.context_embedding.nbytes if self.context_embedding is not None else 0
        texts = len(self.query.encode()) + len(self.answer.encode())
        texts += len((self.context_query or "").encode())
        return texts + self.embedding.nbytes + ctx + 200

    @property
    def last_used(self) -> float:
        return self.last_hit if self.last_hit is not None else self.created

    def with_vectors(
        self, embedding: np.ndarray, context_embedding: np.ndarray | None, encoder_version: str
    ) -> "Entry":
        return replace(
            self,
            embedding=embedding.astype(STORED_DTYPE),
            context_embedding=None if context_embedding is None
            else context_embedding.astype(STORED_DTYPE),
            encoder_version=encoder_version,
        )

    def to_record(self) -> dict[str, object]:
        return {
            "id": self.id, "query": self.query, "answer": self.answer,
            "embedding": self.embedding.astype(STORED_DTYPE).tobytes(),
            "encoder_version": self.encoder_version,
            "context_query": self.context_query,
            "context_embedding": None if self.context_embedding is None
            else self.context_embedding.astype(STORED_DTYPE).tobytes(),
            "conversation_id": self.conversation_id, "turn": self.turn,
            "prev_id": self.prev_id, "source": str(self.source),
            "query_tokens": self.query_tokens, "answer_tokens": self.answer_tokens,
            "created": self.created, "last_hit": self.last_hit, "hits": self.hits,
            "rejections": self.rejections, "threshold_evidence": self.threshold_evidence,
            "asked_by": self.asked_by,
            "context_bound": self.context_bound,
        }

    @classmethod
    def from_record(cls, record: dict[str, object]) -> "Entry":
        ctx = record.get("context_embedding")
        return cls(
            id=str(record["id"]), query=str(record["query"]), answer=str(record["answer"]),
            embedding=np.frombuffer(record["embedding"], dtype=STORED_DTYPE),  # type: ignore[arg-type]
            encoder_version=str(record["encoder_version"]),
            context_query=record.get("context_query"),  # type: ignore[arg-type]
            context_embedding=None if ctx is None
            else np.frombuffer(ctx, dtype=STORED_DTYPE),  # type: ignore[arg-type]
            conversation_id=record.get("conversation_id"),  # type: ignore[arg-type]
            turn=int(record.get("turn", 0)),  # type: ignore[arg-type]
            prev_id=record.get("prev_id"),  # type: ignore[arg-type]
            source=Source(record.get("source", "upstream")),
            query_tokens=int(record.get("query_tokens", 0)),  # type: ignore[arg-type]
            answer_tokens=int(record.get("answer_tokens", 0)),  # type: ignore[arg-type]
            created=float(record["created"]),  # type: ignore[arg-type]
            last_hit=record.get("last_hit"),  # type: ignore[arg-type]
            hits=int(record.get("hits", 0)),  # type: ignore[arg-type]
            rejections=int(record.get("rejections", 0)),  # type: ignore[arg-type]
            threshold_evidence=record.get("threshold_evidence"),  # type: ignore[arg-type]
            asked_by=record.get("asked_by"),  # type: ignore[arg-type]
            context_bound=bool(record.get("context_bound", False)),
        )
