"""Settings: defaults < config.toml < MEANCACHE_* environment variables < command-line flags.

The TOML file lives in the platform's user config dir (``MEANCACHE_CONFIG_DIR`` or
``--config-dir`` moves it); data (cache, encoder state, logs) under the user data dir
(``data_dir`` in the file, ``MEANCACHE_DATA_DIR`` or ``--data-dir``).
"""

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import platformdirs
from meancache.client.cache import CacheSettings
from meancache.client.errors import ConfigError
from meancache.client.upstream_client import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from meancache.shared.encoder import BACKENDS, DEFAULT_PROFILE, profile_threshold
from meancache.shared.threshold import check_threshold

APP_NAME = "meancache"
ENV_PREFIX = "MEANCACHE_"
EMBEDDED_MODEL = "builtin:gemma-3-270m"  # a real model: what runs when none is named


@dataclass(frozen=True)
class Settings:
    config_dir: Path
    data_dir: Path
    encoder_model: str = DEFAULT_PROFILE  # "mpnet", "minilm" or a local model directory
    encoder_backend: str = "onnx-int8"  # "onnx" (float32) or "torch"
    # The cache's settings, passed on by cache_settings(); their defaults are the cache's
    # own. threshold: the global tau until the FL server sends one (unset, the encoder
    # profile's default).
    threshold: float = CacheSettings.global_threshold
    context_aware: bool = CacheSettings.context_aware
    verify_hits: bool = CacheSettings.verify_hits  # a verifier checks every hit
    verifier: str = CacheSettings.verifier  # "learned" (the default) or "rules" (word rules)
    entry_thresholds: bool = CacheSettings.entry_thresholds  # learned from each one's feedback
    max_entries: int = CacheSettings.max_entries
    max_bytes: int = CacheSettings.max_bytes
    eviction_policy: str = CacheSettings.eviction_policy  # "lru", "lfu", "scalm-co", "scalm-se"
    pattern_clustering: str = CacheSettings.pattern_clustering  # "kmeans" (fast) or "dbscan"
    pca_dims: int = CacheSettings.pca_dims
    pca_min_entries: int = CacheSettings.pca_min_entries
    tune_min_per_class: int = CacheSettings.tune_min_per_class
    log_level: str = "INFO"
    upstream_url: str | None = None  # None: the chat starts an embedded upstream
    # The model asked for: `upstream serve` and the embedded upstream run it (unset:
    # EMBEDDED_MODEL); an external upstream is sent its name (unset: the first it lists).
    upstream_model: str | None = None
    upstream_api_key: str | None = None  # the bearer key the upstream asks for / is sent
    # What the chat asks the upstream for; the defaults are the upstream client's.
    answer_max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_TEMPERATURE  # greedy: a cached answer is the model's best
    # Sent with every question too (SAMPLING_FIELDS): the repetition guard's fields for the
    # embedded upstream (whose defaults apply where unset) or another server that takes them.
    upstream_sampling: dict[str, float | bool] = field(default_factory=dict)
    keymap: dict[str, str] = field(default_factory=dict)  # chat binding id -> keys
    fl_server_url: str | None = None  # the FL server's global-model endpoint (sync)
    fl_superlink: str | None = None  # HOST:PORT of the SuperLink the chat may join
    fl_root_certificate: str | None = None  # the FL CA certificate, for TLS
    fl_insecure: bool = False  # allow plain connections to a non-loopback FL server
    # The FL server's signing-key.pub (its one line, or the file's path): a global model is
    # installed only with the server's signature (shared.fl.signing); unset, none is.
    fl_server_public_key: str | None = None
    fl_allow_unsigned: bool = False  # a lab: install global models nobody signed (warned)
    # Install a signed global model or instruction pack older than the one this device has
    # (or has seen replaced); off: such a rollback is refused (shared.fl.freshness).
    allow_downgrade: bool = False
    # `meancache proxy` (client/proxy): the loopback port it serves; app name -> the API key
    # that app sends (empty: any key is accepted and is an app of its own); one cache for
    # every app instead of one each; requests with a temperature above 0 go upstream.
    proxy_port: int = 8788
    proxy_apps: dict[str, str] = field(default_factory=dict)
    proxy_shared: bool = False
    proxy_greedy_only: bool = False
    # The operator's app-signing-key.pub (its ssh-ed25519 line, or the file's path): the
    # SuperNode runs only Flower apps signed with it (shared.fl.app_signing).
    fl_app_public_key: str | None = None
    fl_allow_unsigned_apps: bool = False  # a lab: run whatever app the FL server hands out

    @property
    def embedded_model(self) -> str:
        return self.upstream_model or EMBEDDED_MODEL

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def models_dir(self) -> Path:
        """Where packaged models that must be assembled (MPNet) are kept."""
        return self.data_dir / "models"

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "cache"

    @property
    def packs_dir(self) -> Path:
        """The downloaded instruction pack and its hit count."""
        return self.data_dir / "packs"

    @property
    def encoder_dir(self) -> Path:
        """Exported ONNX models and model fingerprints."""
        return self.data_dir / "encoder"

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
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "meancache.log"

    def cache_settings(self) -> CacheSettings:
        """The cache's settings: every one this has (``threshold`` is the cache's
        ``global_threshold``); the rest keep the cache's defaults."""
        return CacheSettings(global_threshold=self.threshold,
                             **{name: getattr(self, name) for name in _CACHE_FIELDS})


# The settings both have under one name (checked by the tests: each one is passed on).
_CACHE_FIELDS = {f.name for f in fields(CacheSettings)} & {f.name for f in fields(Settings)}


_DIR_FIELDS = {"config_dir", "data_dir"}


def _coerce(name: str, value: Any, where: str) -> Any:
    """Convert a TOML or environment value to the type of setting ``name``."""
    kind = {f.name: f.type for f in fields(Settings)}[name]
    if name in _TABLES:
        return _table(name, value, where)
    if name == "upstream_sampling":
        return _sampling(value, where)
    try:
        if kind in (bool, int, float):
            return _scalar(kind, value)
        if name in _DIR_FIELDS:
            return Path(str(value)).expanduser()
        if not isinstance(value, str):
            raise ValueError(value)
        return value
    except ValueError:
        raise ConfigError(f"{where}: {name} = {value!r} is not a valid "
                          f"{getattr(kind, '__name__', kind)}") from None


def _scalar(kind: type, value: Any) -> bool | int | float:
    """``value`` as TOML gives it, or as text from the environment, read as ``kind`` (bool,
    int or float); ValueError if it is not one."""
    text = isinstance(value, str)
    if kind is bool:
        if text:
            lowered = value.strip().lower()
            if lowered not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(value)
            return lowered in {"1", "true", "yes", "on"}
        if not isinstance(value, bool):
            raise ValueError(value)
        return value
    if kind is int:
        if isinstance(value, bool) or not (text or isinstance(value, int)):
            raise ValueError(value)
        return int(value)
    if isinstance(value, bool) or not (text or isinstance(value, int | float)):
        raise ValueError(value)
    return float(value)


# The settings that are tables of strings: what each maps, and an example.
_TABLES = {"keymap": ("binding ids to keys", "reject=ctrl+x,stats=f5"),
           "proxy_apps": ("app names to API keys", "editor=KEY1,notes=KEY2")}


def _split_pairs(text: str, problem: str) -> dict[str, str]:
    """An environment variable's table, ``"a=b,c=d"``; ``problem`` is the error otherwise."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ConfigError(problem)
    return {k.strip(): v.strip() for k, v in pairs}


def _table(name: str, value: Any, where: str) -> dict[str, str]:
    """A TOML table (``[keymap]``) or, from the environment, ``"a=b,c=d"``."""
    what, example = _TABLES[name]
    if isinstance(value, str):
        value = _split_pairs(value, f"{where}: {name} must look like '{example}'")
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{where}: {name} must map {what}")
    return dict(value)


# What ``upstream_sampling`` may set: the embedded upstream's repetition guard (vLLM and
# llama.cpp servers take some of these names too) and OpenAI's own penalties.
SAMPLING_FIELDS = {"repetition_penalty": float, "repetition_window": int, "stop_on_loops": bool,
                   "dry_multiplier": float, "dry_base": float, "dry_allowed_length": int,
                   "frequency_penalty": float, "presence_penalty": float, "top_p": float}


def _sampling(value: Any, where: str) -> dict[str, float | bool]:
    """A TOML table (``[upstream_sampling]``) or, from the environment, ``"a=1.1,b=0"``."""
    if isinstance(value, str):
        value = _split_pairs(value, f"{where}: upstream_sampling must look like "
                                    "'dry_multiplier=0.8,repetition_penalty=1.1'")
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: upstream_sampling must map field names to values")
    out: dict[str, float | bool] = {}
    for key, raw in value.items():
        kind = SAMPLING_FIELDS.get(key)
        if kind is None:
            raise ConfigError(f"{where}: upstream_sampling has no field {key!r} (known: "
                              f"{', '.join(sorted(SAMPLING_FIELDS))})")
        try:
            out[key] = _scalar(kind, raw)
        except ValueError:
            raise ConfigError(f"{where}: upstream_sampling.{key} = {raw!r} is not a valid "
                              f"{kind.__name__}") from None
    return out


def with_upstream(settings: Settings, url: str | None = None, api_key: str | None = None,
                  model: str | None = None, environ: Mapping[str, str] | None = None
                  ) -> Settings:
    """The chat's upstream: flags win over settings. When neither names an upstream,
    ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` do, as for any OpenAI client (the key is
    never sent to an upstream named elsewhere)."""
    env = os.environ if environ is None else environ
    if not (url or settings.upstream_url) and env.get("OPENAI_BASE_URL", "").strip():
        url = env["OPENAI_BASE_URL"].strip()
        api_key = api_key or settings.upstream_api_key or env.get("OPENAI_API_KEY") or None
    return replace(settings, upstream_url=url or settings.upstream_url,
                   upstream_api_key=api_key or settings.upstream_api_key,
                   upstream_model=model or settings.upstream_model)


def load_settings(
    config_dir: Path | None = None,
    data_dir: Path | None = None,
    environ: dict[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Resolve every setting; flags (``overrides`` that are not None) win."""
    env = dict(os.environ if environ is None else environ)
    config_dir = Path(
        config_dir or env.get(ENV_PREFIX + "CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME)
    ).expanduser()
    values: dict[str, Any] = {}
    config_file = config_dir / "config.toml"
    if config_file.is_file():
        try:
            table = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{config_file} is not valid TOML: {exc}; fix that line (or move "
                              "the file away to start from the defaults)") from None
        known = {f.name for f in fields(Settings)} - {"config_dir"}
        for key, value in table.items():
            if key not in known:
                raise ConfigError(
                    f"{config_file}: unknown setting {key!r} (known: {', '.join(sorted(known))})"
                )
            values[key] = _coerce(key, value, str(config_file))
    for f in fields(Settings):
        if f.name != "config_dir" and ENV_PREFIX + f.name.upper() in env:
            var = ENV_PREFIX + f.name.upper()
            values[f.name] = _coerce(f.name, env[var], f"environment variable {var}")
    for key, value in overrides.items():
        if value is not None:
            values[key] = value
    if data_dir is not None:
        values["data_dir"] = Path(data_dir).expanduser()
    values.setdefault("data_dir", Path(platformdirs.user_data_dir(APP_NAME)))
    values.setdefault("threshold", profile_threshold(values.get("encoder_model", DEFAULT_PROFILE)))
    settings = replace(Settings(config_dir=config_dir, data_dir=values.pop("data_dir")), **values)
    if settings.encoder_backend not in BACKENDS:
        raise ConfigError("encoder_backend must be one of "
                          + ", ".join(repr(b) for b in BACKENDS)
                          + f", not {settings.encoder_backend!r}")
    for name in ("max_entries", "max_bytes"):  # 0 or less would evict every new answer
        if getattr(settings, name) <= 0:
            raise ConfigError(f"{name} must be a positive whole number, not "
                              f"{getattr(settings, name)!r}")
    try:
        check_threshold(settings.threshold)
    except ValueError as exc:
        raise ConfigError(f"threshold: {exc}") from None
    try:
        settings.cache_settings()  # the cache's own checks (policy and clustering names)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return settings
