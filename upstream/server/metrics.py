"""Prometheus metrics of one server (its own registry, so several can share a process)."""

from meancache.upstream.prompt_cache.engine import Finish, PromptCacheEngine
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)

disable_created_metrics()  # the *_created series only add noise to every counter


class ServerMetrics:
    def __init__(self, engine: PromptCacheEngine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("meancache_upstream_requests", "HTTP requests",
                                ["endpoint", "status"], registry=self.registry)
        self.ttft = Histogram(
            "meancache_upstream_time_to_first_token_seconds", "Time to first token",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.prompt_tokens = Counter("meancache_upstream_prompt_tokens", "Prompt tokens read",
                                     registry=self.registry)
        self.cached_tokens = Counter("meancache_upstream_cached_tokens",
                                     "Prompt tokens served from module states or prefix "
                                     "blocks (not computed)", registry=self.registry)
        self.prefix_tokens = Counter("meancache_upstream_prefix_reused_tokens",
                                     "Prompt tokens served from cached prefix blocks "
                                     "(automatic prefix reuse)", registry=self.registry)
        self.completion_tokens = Counter("meancache_upstream_completion_tokens",
                                         "Tokens generated", registry=self.registry)
        self.cancelled = Counter("meancache_upstream_cancelled",
                                 "Completions stopped because the client went away",
                                 registry=self.registry)
        module_bytes = Gauge("meancache_upstream_module_memory_bytes",
                             "Bytes held by cached module states and prefix blocks",
                             registry=self.registry)
        module_bytes.set_function(lambda: engine.modules.nbytes)
        module_tokens = Gauge("meancache_upstream_module_tokens",
                              "Tokens held by cached module states and prefix blocks",
                              registry=self.registry)
        module_tokens.set_function(lambda: engine.modules.tokens)
        per_token = Gauge("meancache_upstream_module_bytes_per_token",
                          "KV bytes per cached token", registry=self.registry)
        per_token.set(engine.bytes_per_token)
        Info("meancache_upstream_model", "The model served and its precision (what `auto` "
             "chose)", registry=self.registry).info({
                 "model": engine.loaded.name, "precision": engine.loaded.precision,
                 "kv_format": engine.kv_format.name})

    def completed(self, finish: Finish) -> None:
        self.ttft.observe(finish.ttft_seconds)
        self.prompt_tokens.inc(finish.prompt_tokens)
        self.cached_tokens.inc(finish.cached_tokens)
        self.prefix_tokens.inc(finish.prefix_tokens)
        self.completion_tokens.inc(finish.completion_tokens)
        if finish.reason == "cancelled":
            self.cancelled.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
