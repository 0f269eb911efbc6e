"""Everything a chat needs, opened together: cache, upstream (embedded or remote),
answer path and conversation store. Shared by `meancache ask` and the chat app."""

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meancache.client.cache import SemanticCache
from meancache.client.chat.answering import AnswerService
from meancache.client.chat.conversations import ConversationStore
from meancache.client.chat.steps import StepReporter
from meancache.client.config import Settings
from meancache.client.encoder import load_device_encoder
from meancache.client.errors import ConfigError, UpstreamUnavailableError
from meancache.client.pack import PackStore
from meancache.client.upstream_client import UpstreamClient
from meancache.client.verifier import load_device_verifier
from meancache.shared.encoder import locate_model
from meancache.shared.progress import Progress

log = logging.getLogger(__name__)


class EmbeddedUpstream(Protocol):
    """An upstream server running in this process, on loopback (see ``UpstreamStarter``)."""

    url: str
    label: str  # what the model is, for the status line
    api_key: str | None  # made for this run of the app: no one else can use the server

    def stop(self) -> None: ...


# Starts the embedded upstream for a model name, keeping converted models in a data dir
# and reporting the steps of a first conversion.
# The client cannot import the upstream (the sides never import each other): the
# `meancache` command joins them and passes this.
UpstreamStarter = Callable[[str, Path, Progress | None], EmbeddedUpstream]


def _timed(steps: StepReporter | None, name: str) -> Progress | None:
    """Open step ``name`` (and log when it began: the log shows where a start's time
    went)."""
    log.info("start: %s", name)
    return None if steps is None else steps(name)


@dataclass
class ChatSession:
    settings: Settings
    cache: SemanticCache
    answers: AnswerService
    conversations: ConversationStore
    upstream_name: str  # where answers come from: the URL and model, or the embedded one
    embedded: EmbeddedUpstream | None = None  # in-process upstream when no URL is set
    upstream_problem: str | None = None  # why the upstream was last found unreachable

    @classmethod
    def open(cls, settings: Settings, progress: Progress | None = None,
             start_upstream: UpstreamStarter | None = None,
             upstream_progress: Progress | None = None,
             background: bool = False,
             pack_progress: Progress | None = None,
             steps: StepReporter | None = None) -> "ChatSession":
        """Load the encoder and cache; check an external upstream (a refused key or an
        unknown model is an error; an unreachable one is noted in ``upstream_problem``, as
        the cache can still answer) or start the embedded one if no URL is set.

        Blocking (seconds on the first run, which exports the encoder to ONNX): call it
        from a worker thread in the app. ``background``: the cache re-embeds and fits PCA
        on its own thread (the chat) instead of before returning (one-shot commands; they
        also make the instruction pack's vectors before returning, with
        ``pack_progress``, so its similar match answers alike on every run). ``steps``
        hears each step of ``steps.startup_steps`` as it begins (the chat shows them).
        """
        url, problem, upstream = settings.upstream_url, None, None
        if url:  # checked first: a wrong key or model fails at once
            _timed(steps, "checking the upstream")
            upstream = UpstreamClient(url, settings.upstream_api_key, settings.upstream_model,
                                      sampling=settings.upstream_sampling)
            try:
                upstream.check()
            except UpstreamUnavailableError as exc:  # the cache still answers what it holds
                problem = str(exc)
        elif start_upstream is None:
            raise ConfigError("no upstream_url is configured: set it, or pass --upstream URL")
        locate_model(settings.encoder_model, settings.models_dir,
                     _timed(steps, "assembling the encoder (first start only)"))
        _timed(steps, "loading the encoder (the first start exports it)")
        encoder = load_device_encoder(settings)
        _timed(steps, "opening the cache")
        cache = SemanticCache(settings.cache_dir, encoder, settings.cache_settings(), progress,
                              background=background, rng=random.Random(),  # it explores
                              verifier=load_device_verifier(settings))
        embedded = None
        if upstream is not None:
            label = f"upstream {url}" + (f" · {upstream.model}" if upstream.model else "")
        else:
            assert start_upstream is not None
            preparing = _timed(steps, "starting the language model (the first start "
                                      "prepares it)")
            embedded = start_upstream(settings.embedded_model, settings.data_dir,
                                      upstream_progress or preparing)
            label = f"embedded upstream: {embedded.label}"
            upstream = UpstreamClient(embedded.url, embedded.api_key,
                                      sampling=settings.upstream_sampling)
        conversations = ConversationStore(settings.conversations_dir)
        answers = AnswerService(cache, upstream, conversations, settings.answer_max_tokens,
                                settings.temperature, PackStore(settings.packs_dir),
                                wait_for_pack=not background, pack_progress=pack_progress)
        return cls(settings, cache, answers, conversations, label, embedded, problem)

    @property
    def upstream_label(self) -> str:
        """What the status line says about where answers come from, as last found."""
        return self.upstream_name + (" (unreachable)" if self.upstream_problem else "")

    def heard_from_upstream(self, problem: str | None) -> bool:
        """The upstream answered (``problem`` None) or could not be reached (why); returns
        whether that changes what the status line says, so that a start's "unreachable"
        goes once it answers and comes back when it stops."""
        changed = (problem is None) != (self.upstream_problem is None)
        self.upstream_problem = problem
        return changed

    async def aclose(self) -> None:
        await self.answers.upstream.aclose()
        if self.embedded is not None:
            self.embedded.stop()
        if self.answers.packs is not None:
            self.answers.packs.close()
        self.cache.close()
