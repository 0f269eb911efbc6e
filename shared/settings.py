"""What every side's settings share, and how one side's are resolved: defaults <
config.toml < ``MEANCACHE_*`` environment variables < command-line flags.

Each side declares one typed model on :class:`SettingsBase` (``client.config.Settings``,
``upstream.config.UpstreamSettings``, ``fl_server.config.FlServerSettings``) and a command
loads its own side's alone. Which keys of config.toml each side reads (the top level is the
device's; ``[upstream]`` and ``[fl_server]`` are the servers' own) is written once, as the
configuration reference's opening (``settings_reference.REFERENCE_INTRO``). A setting more
than one side reads is declared once, in a mixin here that each of those sides' models
inherits, so every default is written in one place.
"""

import difflib
import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

import platformdirs
from meancache.shared.arguments import undecodable_setting
from meancache.shared.encoder import DEFAULT_PROFILE
from meancache.shared.errors import ConfigError
from pydantic import AliasChoices, BaseModel, Field, PrivateAttr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

APP_NAME = "meancache"
ENV_PREFIX = "MEANCACHE_"
CONFIG_FILE = "config.toml"
SIDE_TABLES = ("upstream", "fl_server")  # config.toml's tables of one side's keys
EMBEDDED_MODEL = "builtin:gemma-3-270m"  # a real model: what runs when none is named
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT = "default"  # the origin of a value nobody set
FLAG = "command line"  # the origin of a flag's value
SHOWN = "shown_default"  # a field's default as the reference prints it (where it varies)
SECRET = "secret"  # a field `config show` never prints


def setting_key(name: str, info: FieldInfo) -> str:
    """The name a field has in config.toml and after ``MEANCACHE_``: its first alias where
    the file's name differs from the code's (``threshold`` for ``global_threshold``)."""
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        alias = alias.choices[0]
    return alias if isinstance(alias, str) else name


def env_var(key: str) -> str:
    return ENV_PREFIX + key.upper()


def split_pairs(text: str, key: str, example: str) -> dict[str, str]:
    """An environment variable's table, ``"a=b,c=d"``; ValueError naming ``key`` otherwise."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"{key} must look like '{example}'")
    return {k.strip(): v.strip() for k, v in pairs}


class SettingsBase(BaseSettings):
    """Where a side's files live and how it logs; the loading every side shares."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix=ENV_PREFIX)
    file_table: ClassVar[str | None] = None  # the side's own table in config.toml
    owns_top_level: ClassVar[bool] = False  # every top-level key is this side's

    config_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_config_dir(APP_NAME)),
        description="Where config.toml lives (`--config-dir` or the environment variable; "
        "not a key of the file).", json_schema_extra={SHOWN: "the platform's user config dir"})
    data_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir(APP_NAME)),
        description="Where the cache, models, state and logs live (`--data-dir`).",
        json_schema_extra={SHOWN: "the platform's user data dir"})
    log_level: str = Field("INFO", description="The log file's level: "
                           + ", ".join(LOG_LEVELS) + " (logs go to data_dir/logs).")
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   **others: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what the constructor is given: :meth:`load` reads the file and the
        environment itself, so it knows where each value came from (and a model built
        directly, in a test, never reads the environment)."""
        return (init_settings,)

    @field_validator("config_dir", "data_dir", mode="after")
    @classmethod
    def _expand_user(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("log_level", mode="after")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
        return value.upper()

    @property
    def config_file(self) -> Path:
        return self.config_dir / CONFIG_FILE

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "meancache.log"

    @property
    def models_dir(self) -> Path:
        """Where packaged models that must be assembled (MPNet) are kept: every side's
        (the device embeds with MPNet, the verifier's training commands read it too)."""
        return self.data_dir / "models"

    @property
    def encoder_dir(self) -> Path:
        """Exported ONNX models and model fingerprints."""
        return self.data_dir / "encoder"

    @classmethod
    def file_keys(cls) -> dict[str, str]:
        """config.toml's key (and ``MEANCACHE_`` + it upper-cased) of each field: key ->
        field name. ``config_dir`` says where the file is, so it is none of them."""
        return {setting_key(name, info): name for name, info in cls.model_fields.items()
                if name != "config_dir"}

    def origin(self, name: str) -> str:
        """Where field ``name``'s value came from: "default", config.toml's path (and
        table), the environment variable's name, or "command line"."""
        return self._origins.get(name, DEFAULT)

    @classmethod
    def load(cls, config_dir: Path | None = None, environ: Mapping[str, str] | None = None,
             flag_names: Mapping[str, str] | None = None, **flags: Any) -> Self:
        """Resolve every setting of this side; flags that are not None win. ``flags`` are
        keyed by config.toml's key or the field's name; ``flag_names`` (field -> the flag
        that set it) name their origin, "command line" otherwise."""
        env = os.environ if environ is None else environ
        named = flag_names or {}
        chosen: dict[str, tuple[Any, str]] = {}
        if config_dir is not None:
            chosen["config_dir"] = (config_dir, named.get("config_dir", FLAG))
        elif env.get(env_var("config_dir")):
            chosen["config_dir"] = (env[env_var("config_dir")], env_var("config_dir"))
        directory = (Path(chosen["config_dir"][0]).expanduser() if "config_dir" in chosen
                     else cls.model_fields["config_dir"].get_default(call_default_factory=True))
        for source in (TomlKeys(cls, directory / CONFIG_FILE), EnvironmentKeys(cls, env)):
            chosen |= source.found
        keys = cls.file_keys() | {"config_dir": "config_dir"}
        chosen |= {keys.get(key, key): (value, named.get(keys.get(key, key), FLAG))
                   for key, value in flags.items() if value is not None}
        for value, where in chosen.values():
            if (refusal := undecodable_setting(where, value)) is not None:
                raise ConfigError(refusal)
        try:
            settings = cls(**{name: value for name, (value, _) in chosen.items()})
        except ValidationError as exc:
            raise ConfigError("; ".join(_explain(cls, error, chosen) for error in exc.errors())
                              ) from None
        settings._origins = {name: where for name, (_, where) in chosen.items()}
        return settings

    def effective(self) -> list[tuple[str, Any, str]]:
        """(key, value, origin) of every setting, as `meancache config show` prints them;
        a secret's value is never shown, only whether it is set."""
        rows = [("config_dir", self.config_dir, self.origin("config_dir"))]
        for key, name in self.file_keys().items():
            value = getattr(self, name)
            if field_extra(type(self).model_fields[name]).get(SECRET) and value:
                value = "(set)" if not isinstance(value, dict) else dict.fromkeys(value, "(set)")
            rows.append((key, value, self.origin(name)))
        return rows


def field_extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _explain(cls: type[SettingsBase], error: Any, chosen: dict[str, tuple[Any, str]]) -> str:
    """One validation error as the user reads it: where the value came from, its key and
    what is wrong with it."""
    name = str(error["loc"][0]) if error["loc"] else ""
    fields = {alias: field for field, info in cls.model_fields.items()
              for alias in [field, setting_key(field, info)]}
    name = fields.get(name, name)
    info = cls.model_fields.get(name)
    key = setting_key(name, info) if info else name
    value, where = chosen.get(name, (error.get("input"), DEFAULT))
    if error["type"] == "value_error":
        problem = str(error["ctx"]["error"])
    else:
        problem = f"{key} = {value!r} is not valid: {error['msg']}"
    problem = problem if not key or problem.startswith(key) else f"{key}: {problem}"
    return problem if where == DEFAULT else f"{where}: {problem}"



def _meant(key: str, known: Iterable[str]) -> str:
    """", did you mean 'max_wrong_rate'?" for the known name closest to a misspelt
    ``key`` ("maxwrongrate", "treshold"), or nothing where none is close."""
    close = difflib.get_close_matches(key.lower(), list(known), n=1, cutoff=0.75)
    return f", did you mean {close[0]!r}?" if close else ""


class TomlKeys(PydanticBaseSettingsSource):
    """The values config.toml gives one side (see the module's docstring for whose keys
    are where), each with where it was found."""

    def __init__(self, settings_cls: type[SettingsBase], path: Path) -> None:
        super().__init__(settings_cls)
        self.side = settings_cls
        self.path = path
        self.found: dict[str, tuple[Any, str]] = self._read() if path.is_file() else {}

    def _read(self) -> dict[str, tuple[Any, str]]:
        try:
            table = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{self.path} is not valid TOML: {exc}; fix that line (or move "
                              "the file away to start from the defaults)") from None
        keys = self.side.file_keys()
        known = ", ".join(sorted(keys))
        found = {}
        for key, value in table.items():
            if key in SIDE_TABLES and not isinstance(value, dict):
                raise ConfigError(f"{self.path}: {key} must be a table ([{key}]) of the "
                                  f"{key} side's settings")
            if key in keys and key not in SIDE_TABLES:
                found[keys[key]] = (value, str(self.path))
            elif self.side.owns_top_level and key not in SIDE_TABLES:
                raise ConfigError(f"{self.path}: unknown setting {key!r}{_meant(key, keys)} "
                                  f"(known: {known}; [{'], ['.join(SIDE_TABLES)}] hold the "
                                  "servers' own)")
        own = self.side.file_table
        section = table.get(own) if own else None
        if not isinstance(section, dict):
            return found
        for key, value in section.items():
            if key not in keys:
                raise ConfigError(f"{self.path}: [{own}] has no setting {key!r}"
                                  f"{_meant(key, keys)} (known: {known})")
            found[keys[key]] = (value, f"{self.path} [{own}]")
        return found

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value = self.found.get(field_name)
        return (None if value is None else value[0]), field_name, False

    def __call__(self) -> dict[str, Any]:
        return {name: value for name, (value, _) in self.found.items()}


class EnvironmentKeys(PydanticBaseSettingsSource):
    """``MEANCACHE_<KEY>`` of each of one side's keys, as text: the model's validators
    read it (``"off"`` as a bool, ``"a=b,c=d"`` as a table)."""

    def __init__(self, settings_cls: type[SettingsBase], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.found = {name: (environ[env_var(key)], env_var(key))
                      for key, name in settings_cls.file_keys().items()
                      if env_var(key) in environ}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value = self.found.get(field_name)
        return (None if value is None else value[0]), field_name, False

    def __call__(self) -> dict[str, Any]:
        return {name: value for name, (value, _) in self.found.items()}


class EncoderChoice(BaseModel):
    """The encoder a side uses: the device embeds with it, the FL server trains it."""

    encoder_model: str = Field(DEFAULT_PROFILE, description="The encoder: 'mpnet', 'minilm' "
                               "(fast) or a local sentence-transformers model directory "
                               "(`--encoder`).")


class UpstreamChoice(BaseModel):
    """The model the upstream serves and the key it asks for: `upstream serve` and the
    embedded upstream run the model, the device asks an upstream for it and sends the key."""

    upstream_model: str | None = Field(
        None, description="The model asked for: `upstream serve` and the embedded upstream "
        f"run it (unset: {EMBEDDED_MODEL}); an external upstream is sent its name (unset: "
        "the first it lists).")
    upstream_api_key: str | None = Field(
        None, description="The bearer key the upstream asks for and the device sends.",
        json_schema_extra={SECRET: True})

    @property
    def embedded_model(self) -> str:
        return self.upstream_model or EMBEDDED_MODEL


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it (a table inline)."""
    if isinstance(value, dict):
        return ("{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
                + "}")
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, int | float) else json.dumps(str(value))


def check_choice(setting: str, value: str, valid: tuple[str, ...]) -> str:
    """``value`` if it is one of ``valid``; else a ValueError naming it and the valid ones."""
    if value not in valid:
        raise ValueError(f"{setting} {value!r} is unknown; valid: {', '.join(valid)}")
    return value
