"""Conversations persist as one JSON file each, written atomically (a crash mid-save
leaves the previous version). Files written before turns recorded a typed origin (they
hold ``source``, ``similarity``, ``matched_query``, ``entry_id`` and ``hit_id``) still
load: their origin is rebuilt from those fields."""

import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meancache.client.errors import ConversationNotFoundError
from meancache.client.matching.origins import (
    CacheOrigin,
    Origin,
    PackOrigin,
    Source,
    UpstreamOrigin,
    origin_from_json,
    origin_to_json,
    rejectable,
)
from meancache.shared.files import write_json_atomic
from meancache.shared.query import normalise_query

log = logging.getLogger(__name__)


@dataclass
class Turn:
    question: str
    answer: str
    origin: Origin  # what answered: feedback on the answer goes back to it
    ttft_seconds: float | None = None
    cached_tokens: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    replaced: str | None = None  # the rejected answer this one replaced
    truncated: bool = False  # the question was longer than the embedding model's window
    created: float = field(default_factory=time.time)
    finish_reason: str | None = None  # why the upstream stopped ("stop", "length", ...)
    declined: str | None = None  # a near match the cache's verifier refused, and why
    cut: str | None = None  # why the client cut the upstream's answer short (not cached)

    @property
    def source(self) -> Source:
        return self.origin.source

    @property
    def similarity(self) -> float | None:
        return None if isinstance(self.origin, UpstreamOrigin) else self.origin.similarity

    @property
    def matched_query(self) -> str | None:
        return None if isinstance(self.origin, UpstreamOrigin) else self.origin.matched_query

    @property
    def hit_id(self) -> str | None:
        """The served match a rejection refers to (None for an upstream answer)."""
        return None if isinstance(self.origin, UpstreamOrigin) else self.origin.hit_id

    @property
    def entry_id(self) -> str | None:
        """The cache entry that holds (or served) this answer."""
        return None if isinstance(self.origin, PackOrigin) else self.origin.entry_id

    @property
    def empty(self) -> bool:
        """An answer of nothing but whitespace: never cached, always rejectable."""
        return not self.answer.strip()

    @property
    def rejectable(self) -> bool:
        """Whether "wrong answer" may take this turn (``origins.rejectable``)."""
        return rejectable(self.origin, self.empty)

    @property
    def shown_answer(self) -> str:
        """The answer as the chat and `ask` show it: an empty one says so, and why."""
        if not self.empty:
            return self.answer
        return f"(empty answer; the server stopped: {self.finish_reason or 'no reason given'})"

    @property
    def pack_exact(self) -> bool:
        """A pack answer to the very question (normalised), not to a similar instruction."""
        return isinstance(self.origin, PackOrigin) and self.origin.exact

    def to_json(self) -> dict[str, Any]:
        """The turn's fields, its origin tagged by kind, and its source string (for
        people reading the file)."""
        return asdict(self) | {"origin": origin_to_json(self.origin),
                               "source": str(self.source)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Turn":
        fields = dict(data)
        if "origin" in fields:
            fields.pop("source", None)
            fields["origin"] = origin_from_json(fields["origin"])
        else:
            fields["origin"] = _legacy_origin(fields)
        return cls(**fields)

    @property
    def badge(self) -> str:
        """Where the answer came from, in one line: the chat, `ask` and exports show it."""
        if self.source is Source.PACK and not self.pack_exact:
            line = f"pack ~{self.similarity or 0.0:.2f} · matched “{self.matched_query}”"
        elif self.source.from_cache:
            line = f"{self.source} · similarity {self.similarity or 0.0:.2f} · matched " \
                   f"“{self.matched_query}”"
        else:
            ttft = "?" if self.ttft_seconds is None else f"{self.ttft_seconds * 1000:.0f} ms"
            declined = "" if self.declined is None else f" · {self.declined}"
            line = f"{self.source}{declined} · first token {ttft} · {self.cached_tokens} " \
                   "prompt tokens reused"
        if self.replaced is not None:
            line += " · replaced " + ("a rejected cached answer" if self.replaced.strip()
                                      else "an empty answer")
        if self.cut:
            line += f" · cut short, not cached: {self.cut}"
        elif self.finish_reason == "length":
            line += f" · cut at the {self.completion_tokens or '?'}-token limit (answer_max_tokens)"
        if self.truncated:
            line += " · question truncated for matching"
        return line


@dataclass
class Document:
    """A file attached to a conversation, sent before each question about it (as a module
    a meancache upstream keeps: client.chat.documents)."""

    path: str
    chars: int  # its length when attached

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Document":
        """Also a document saved when documents were PML schemas (no ``chars``)."""
        return cls(str(data["path"]), int(data.get("chars", 0)))


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    turns: list[Turn] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"turns": [turn.to_json() for turn in self.turns]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Conversation":
        return cls(
            id=data["id"], title=data.get("title", "Chat"), created=data["created"],
            turns=[Turn.from_json(t) for t in data.get("turns", [])],
            documents=[Document.from_json(d) for d in data.get("documents", [])],
        )

    def add(self, turn: Turn) -> None:
        """The next turn (a first question also names the conversation)."""
        if not self.turns:
            self.title = turn.question[:60]
        self.turns.append(turn)

    def messages(self) -> list[dict[str, str]]:
        """The history as chat messages, for the upstream."""
        out: list[dict[str, str]] = []
        for turn in self.turns:
            out += [{"role": "user", "content": turn.question},
                    {"role": "assistant", "content": turn.answer}]
        return out

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        for doc in self.documents:
            lines.append(f"_Attached: {doc.path} ({doc.chars} characters)_")
        for turn in self.turns:
            lines += ["", f"**You:** {turn.question}", "", f"**Answer** ({turn.badge}):", "",
                      turn.answer]
        return "\n".join(lines) + "\n"


def _legacy_origin(fields: dict[str, Any]) -> Origin:
    """The origin of a turn saved before origins were recorded (its flat fields are
    removed from ``fields``)."""
    source = Source(fields.pop("source"))
    similarity, matched = fields.pop("similarity", None), fields.pop("matched_query", None)
    entry_id, hit_id = fields.pop("entry_id", None), fields.pop("hit_id", None)
    if source is Source.PACK:
        instruction = matched or normalise_query(fields["question"])
        pack_id = (hit_id or "").removeprefix("pack:")  # the pack's id named every hit
        return PackOrigin(uuid.uuid4().hex, pack_id, instruction, similarity or 1.0,
                          exact=instruction == normalise_query(fields["question"]))
    if source is Source.CACHE:
        return CacheOrigin(hit_id or "", entry_id or "", matched or "", similarity or 0.0)
    return UpstreamOrigin(entry_id)


def _not_found(conversation_id: str) -> ConversationNotFoundError:
    return ConversationNotFoundError(
        f"no conversation {conversation_id!r}; `meancache ask` prints the id of each "
        "conversation and the chat lists them (ctrl+o)")


class ConversationStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, conversation_id: str) -> Path:
        if not conversation_id.isalnum():
            raise _not_found(conversation_id)
        return self.directory / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> None:
        write_json_atomic(self._path(conversation.id), conversation.to_json())

    def load(self, conversation_id: str) -> Conversation:
        path = self._path(conversation_id)
        try:
            return Conversation.from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise _not_found(conversation_id) from None

    def list(self) -> list[Conversation]:
        """Every readable conversation, newest first; unreadable files are logged, kept."""
        found = []
        for path in self.directory.glob("*.json"):
            try:
                found.append(Conversation.from_json(json.loads(path.read_text("utf-8"))))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("skipping unreadable conversation %s: %s", path, exc)
        return sorted(found, key=lambda c: c.created, reverse=True)

    def delete(self, conversation_id: str) -> None:
        try:
            self._path(conversation_id).unlink()
        except FileNotFoundError:
            raise _not_found(conversation_id) from None
