"""The device's settings (every client command's): one typed model whose defaults are
written once, here or in the parts it inherits (the cache's and matcher's settings,
client.cache.settings; the encoder and upstream choices shared with the servers,
shared.settings). Resolved by ``load_settings``: defaults < config.toml's top-level keys <
``MEANCACHE_*`` environment variables < command-line flags (shared.settings says which keys
each side reads).
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from meancache.client.cache import CacheSettings
from meancache.client.upstream_client import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from meancache.shared.arguments import undecodable_setting
from meancache.shared.encoder import BACKENDS, DEFAULT_PROFILE, is_mpnet, profile_threshold
from meancache.shared.errors import ConfigError
from meancache.shared.settings import (
    SECRET,
    EncoderChoice,
    SettingsBase,
    UpstreamChoice,
    split_pairs,
)
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

# What ``upstream_sampling`` may set: the embedded upstream's repetition guard (vLLM and
# llama.cpp servers take some of these names too) and OpenAI's own penalties.
SAMPLING_FIELDS = {"repetition_penalty": float, "repetition_window": int, "stop_on_loops": bool,
                   "dry_multiplier": float, "dry_base": float, "dry_allowed_length": int,
                   "frequency_penalty": float, "presence_penalty": float, "top_p": float}


class Settings(CacheSettings, UpstreamChoice, EncoderChoice, SettingsBase):
    """The device's settings: config.toml's top-level keys are these."""

    owns_top_level: ClassVar[bool] = True

    encoder_backend: str = Field("onnx-int8", description="The encoder's runtime: "
                                 + ", ".join(repr(b) for b in BACKENDS) + " (`--backend`).")
    upstream_url: str | None = Field(None, description="The upstream's URL (unset: the chat "
                                     "starts an embedded upstream; `OPENAI_BASE_URL` names one "
                                     "when nothing else does).")
    answer_max_tokens: int = Field(DEFAULT_MAX_TOKENS, gt=0, description="The longest answer "
                                   "the chat asks the upstream for, in tokens.")
    temperature: float = Field(DEFAULT_TEMPERATURE, ge=0, description="The chat's sampling "
                               "temperature (0, greedy: a cached answer is the model's best).")
    upstream_sampling: dict[str, float | bool] = Field(
        default_factory=dict, description="Sent with every question: the repetition guard's "
        "fields (" + ", ".join(sorted(SAMPLING_FIELDS)) + ") for the embedded upstream (whose "
        "defaults apply where unset) or another server that takes them; a table, or "
        "'a=1.1,b=0' in the environment.")
    keymap: dict[str, str] = Field(default_factory=dict, description="The chat's key "
                                   "bindings: binding id to keys; a table, or "
                                   "'reject=ctrl+x,stats=f5' in the environment.")
    fl_server_url: str | None = Field(None, description="The FL server's global-model "
                                      "endpoint (`fl sync`).")
    fl_superlink: str | None = Field(None, description="HOST:PORT of the SuperLink the chat "
                                     "may join.")
    fl_root_certificate: str | None = Field(None, description="The FL CA certificate, for "
                                            "TLS.")
    fl_insecure: bool = Field(False, description="Allow plain connections to a non-loopback "
                              "FL server.")
    fl_server_public_key: str | None = Field(
        None, description="The FL server's signing-key.pub (its one line, or the file's path): "
        "a global model is installed only with the server's signature; unset, none is.")
    fl_allow_unsigned: bool = Field(False, description="A lab: install global models nobody "
                                    "signed (warned).")
    allow_downgrade: bool = Field(
        False, description="Install a signed global model or instruction pack older than the "
        "one this device has (or has seen replaced); off: such a rollback is refused "
        "(also `fl sync --allow-downgrade`, `pack update --allow-downgrade`).")
    fl_app_public_key: str | None = Field(
        None, description="The operator's app-signing-key.pub (its ssh-ed25519 line, or the "
        "file's path): the SuperNode runs only Flower apps signed with it.")
    fl_allow_unsigned_apps: bool = Field(False, description="A lab: run whatever app the FL "
                                         "server hands out.")
    proxy_port: int = Field(8788, gt=0, lt=65536, description="The loopback port "
                            "`meancache proxy` serves.")
    proxy_apps: dict[str, str] = Field(
        default_factory=dict, description="`meancache proxy`'s apps: app name to the API key "
        "that app sends (empty: any key is accepted and is an app of its own); a table, or "
        "'editor=KEY1,notes=KEY2' in the environment.", json_schema_extra={SECRET: True})
    proxy_shared: bool = Field(False, description="One cache for every proxy app instead of "
                               "one each.")
    proxy_greedy_only: bool = Field(False, description="Proxy requests with a temperature "
                                    "above 0 go upstream.")

    @model_validator(mode="before")
    @classmethod
    def _threshold_of_the_encoder(cls, data: Any) -> Any:
        """An unset threshold is the encoder profile's (MPNet's differs from MiniLM's)."""
        if isinstance(data, dict) and not {"threshold", "global_threshold"} & data.keys():
            model = data.get("encoder_model", DEFAULT_PROFILE)
            data = data | {"global_threshold": profile_threshold(str(model))}
        return data

    @field_validator("encoder_backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in BACKENDS:
            raise ValueError("encoder_backend must be one of "
                             + ", ".join(repr(b) for b in BACKENDS) + f", not {value!r}")
        return value

    @field_validator("keymap", "proxy_apps", mode="before")
    @classmethod
    def _table(cls, value: Any, info: Any) -> Any:
        """A TOML table, or from the environment ``"a=b,c=d"``."""
        example = {"keymap": "reject=ctrl+x,stats=f5",
                   "proxy_apps": "editor=KEY1,notes=KEY2"}[info.field_name]
        return split_pairs(value, info.field_name, example) if isinstance(value, str) else value

    @field_validator("upstream_sampling", mode="before")
    @classmethod
    def _sampling(cls, value: Any) -> dict[str, float | bool]:
        """A TOML table (``[upstream_sampling]``) or, from the environment, ``"a=1.1,b=0"``;
        each field as its kind."""
        if isinstance(value, str):
            value = split_pairs(value, "upstream_sampling",
                                "dry_multiplier=0.8,repetition_penalty=1.1")
        if not isinstance(value, dict):
            raise ValueError("upstream_sampling must map field names to values")
        out: dict[str, float | bool] = {}
        for key, raw in value.items():
            kind = SAMPLING_FIELDS.get(key)
            if kind is None:
                raise ValueError(f"upstream_sampling has no field {key!r} (known: "
                                 f"{', '.join(sorted(SAMPLING_FIELDS))})")
            try:
                out[key] = TypeAdapter(kind).validate_python(raw)
            except ValidationError:
                raise ValueError(f"upstream_sampling.{key} = {raw!r} is not a valid "
                                 f"{kind.__name__}") from None
        return out

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "cache"

    @property
    def packs_dir(self) -> Path:
        """The downloaded instruction pack and its hit count."""
        return self.data_dir / "packs"

    @property
    def global_model_dir(self) -> Path:
        """Global models from federated learning (shared.fl.checkpoint layout)."""
        return self.data_dir / "fl" / "global"

    @property
    def conversations_dir(self) -> Path:
        return self.data_dir / "conversations"

    @property
    def fl_certificate(self) -> Path | None:
        return Path(self.fl_root_certificate).expanduser() if self.fl_root_certificate else None

    @property
    def learned_decision(self) -> bool:
        """The learned decision's card decides, so its score judges the bound: the setting
        with the encoder it was fitted on (MPNet; whether the verifier is the card's too
        is known only where it is loaded)."""
        return self.decision == "learned" and is_mpnet(self.encoder_model)

    @property
    def learns_from_answers(self) -> bool:
        """Whether the cache labels its traffic by the upstream's answers: as set, else only
        with an upstream the user named (the embedded demo model's answers to two wordings
        agree for 44% of same-question pairs and 24% of different ones: docs/cache.md)."""
        if self.learn_from_answers is not None:
            return self.learn_from_answers
        return self.upstream_url is not None

    def cache_settings(self) -> CacheSettings:
        """The cache's part of these settings (its fields are these fields), with whether it
        learns from the upstream's answers decided (``learns_from_answers``)."""
        fields = {name: getattr(self, name) for name in CacheSettings.model_fields}
        return CacheSettings(**fields | {"learn_from_answers": self.learns_from_answers})


def with_upstream(settings: Settings, url: str | None = None, api_key: str | None = None,
                  model: str | None = None, environ: Mapping[str, str] | None = None
                  ) -> Settings:
    """The chat's upstream: flags win over settings. When neither names an upstream,
    ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` do, as for any OpenAI client (the key is
    never sent to an upstream named elsewhere)."""
    env = os.environ if environ is None else environ
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        if (refusal := undecodable_setting(name, env.get(name))) is not None:
            raise ConfigError(refusal)
    if not (url or settings.upstream_url) and env.get("OPENAI_BASE_URL", "").strip():
        url = env["OPENAI_BASE_URL"].strip()
        api_key = api_key or settings.upstream_api_key or env.get("OPENAI_API_KEY") or None
    return settings.model_copy(update={
        "upstream_url": url or settings.upstream_url,
        "upstream_api_key": api_key or settings.upstream_api_key,
        "upstream_model": model or settings.upstream_model})


def load_settings(config_dir: Path | None = None, data_dir: Path | None = None,
                  environ: Mapping[str, str] | None = None, **flags: Any) -> Settings:
    """The device's settings; flags (``flags`` and ``data_dir`` that are not None) win."""
    return Settings.load(config_dir, environ, data_dir=data_dir, **flags)
