"""Settings precedence: defaults < config.toml < MEANCACHE_* < flags; clear errors; each
side reads its own keys."""

import re
from pathlib import Path

import platformdirs
import pytest
from meancache.client.cache import CacheSettings
from meancache.client.config import Settings, load_settings, with_upstream
from meancache.client.errors import ConfigError
from meancache.client.matching.settings import MatchSettings
from meancache.fl_server.config import FlServerSettings
from meancache.shared.settings import (
    FLAG,
    EncoderChoice,
    SettingsBase,
    UpstreamChoice,
)
from meancache.shared.threshold import DEFAULT_THRESHOLD, MPNET_THRESHOLD
from meancache.upstream.config import UpstreamSettings

from tests.support.paths import REPO


def write_config(config_dir: Path, text: str) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.toml").write_text(text)


def test_defaults_use_platform_dirs_when_nothing_is_set(tmp_path: Path) -> None:
    settings = load_settings(config_dir=tmp_path, environ={})
    assert settings.encoder_model == "mpnet"
    assert settings.global_threshold == MPNET_THRESHOLD != DEFAULT_THRESHOLD
    assert settings.models_dir == settings.data_dir / "models"
    assert settings.encoder_backend == "onnx-int8"
    assert settings.embedded_model == "builtin:gemma-3-270m"  # a real model, not noise
    assert settings.upstream_model is None  # an external upstream is asked what it serves
    assert settings.data_dir == Path(platformdirs.user_data_dir("meancache"))
    assert settings.config_dir == tmp_path
    assert settings.log_file == settings.data_dir / "logs" / "meancache.log"


@pytest.mark.parametrize(("encoder", "threshold"), [
    ("minilm", DEFAULT_THRESHOLD), ("mpnet", MPNET_THRESHOLD), ("/some/model", DEFAULT_THRESHOLD),
])
def test_an_unset_threshold_comes_from_the_encoder_profile(tmp_path: Path, encoder: str,
                                                          threshold: float) -> None:
    env = {"MEANCACHE_ENCODER_MODEL": encoder}
    assert load_settings(config_dir=tmp_path, environ=env).global_threshold == threshold
    assert load_settings(config_dir=tmp_path, environ=env, threshold=0.5).global_threshold == 0.5
    write_config(tmp_path, "threshold = 0.75\n")
    assert load_settings(config_dir=tmp_path, environ=env).global_threshold == 0.75


def test_the_cache_is_given_every_cache_setting_and_shares_its_defaults(
        tmp_path: Path) -> None:
    settings = Settings(config_dir=tmp_path, data_dir=tmp_path / "data",
                        threshold=DEFAULT_THRESHOLD)
    # the one setting the device decides: with no upstream named, the embedded demo model
    assert settings.cache_settings() == CacheSettings(learn_from_answers=False)
    changed = {"global_threshold": 0.9, "context_aware": False, "verify_hits": False,
               "entry_thresholds": False, "max_entries": 7, "max_bytes": 9,
               "eviction_policy": "lfu", "pattern_clustering": "dbscan", "pca_dims": 0,
               "pca_min_entries": 3, "tune_min_per_class": 2, "verifier": "rules",
               "candidates": 3, "recall_margin": 0.05, "max_wrong_rate": 0.05,
               "decision": "rules", "explore_rate": 0.3, "explore_width": 0.1,
               "explore_beyond_rate": 0.05, "explore_warmup": 20,
               "explore_until_learned": False, "learn_from_answers": True}
    got = settings.model_copy(update=changed).cache_settings()
    assert got.model_dump() == CacheSettings().model_dump() | changed
    assert set(changed) == set(CacheSettings.model_fields)  # every one is the user's to set
    matching = got.matching
    assert matching.model_dump() == {name: changed[name] for name in MatchSettings.model_fields}


@pytest.mark.parametrize(("upstream_url", "environ", "learns"), [
    (None, {}, False), ("http://127.0.0.1:8000/v1", {}, True),
    (None, {"MEANCACHE_LEARN_FROM_ANSWERS": "on"}, True),
    ("http://127.0.0.1:8000/v1", {"MEANCACHE_LEARN_FROM_ANSWERS": "off"}, False),
])
def test_the_cache_learns_from_a_named_upstreams_answers_not_the_demo_models_unless_told(
        tmp_path: Path, upstream_url: str | None, environ: dict[str, str],
        learns: bool) -> None:
    settings = with_upstream(load_settings(config_dir=tmp_path, environ=environ),
                             upstream_url, environ={})
    assert settings.learns_from_answers is learns
    assert settings.cache_settings().learn_from_answers is learns


def test_each_setting_is_declared_once_and_each_side_has_its_own() -> None:
    """A new setting touches one class: no model repeats a field another declares, and
    the sides share fields only through the shared mixins."""
    declaring = [SettingsBase, EncoderChoice, UpstreamChoice, MatchSettings, CacheSettings,
                 Settings, UpstreamSettings, FlServerSettings]
    owners: dict[str, list[str]] = {}
    for model in declaring:
        for name in model.__annotations__:
            if name in model.model_fields:
                owners.setdefault(name, []).append(model.__name__)
    assert {name: found for name, found in owners.items() if len(found) > 1} == {}
    assert set(UpstreamSettings.model_fields) == {
        "config_dir", "data_dir", "log_level", "upstream_model", "upstream_api_key"}
    assert set(FlServerSettings.model_fields) == {
        "config_dir", "data_dir", "log_level", "encoder_model"}
    assert set(Settings.model_fields) > set(UpstreamSettings.model_fields) | set(
        FlServerSettings.model_fields) | set(CacheSettings.model_fields)


def test_toml_then_environment_then_flags(tmp_path: Path) -> None:
    write_config(tmp_path, f'threshold = 0.9\nmax_entries = 7\ndata_dir = "{tmp_path / "d1"}"\n')
    settings = load_settings(config_dir=tmp_path, environ={})
    assert (settings.global_threshold, settings.max_entries) == (0.9, 7)
    assert settings.data_dir == tmp_path / "d1"

    env = {"MEANCACHE_THRESHOLD": "0.8", "MEANCACHE_CONTEXT_AWARE": "off",
           "MEANCACHE_DATA_DIR": str(tmp_path / "d2")}
    settings = load_settings(config_dir=tmp_path, environ=env)
    assert settings.global_threshold == 0.8
    assert settings.context_aware is False
    assert settings.max_entries == 7
    assert settings.data_dir == tmp_path / "d2"

    settings = load_settings(config_dir=tmp_path, data_dir=tmp_path / "d3", environ=env,
                             threshold=0.75)
    assert settings.global_threshold == 0.75
    assert settings.data_dir == tmp_path / "d3"


def test_config_dir_from_environment(tmp_path: Path) -> None:
    write_config(tmp_path / "cfg", "pca_dims = 32\n")
    settings = load_settings(environ={"MEANCACHE_CONFIG_DIR": str(tmp_path / "cfg")})
    assert settings.pca_dims == 32
    assert settings.config_file == tmp_path / "cfg" / "config.toml"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("treshold = 0.9\n", "unknown setting 'treshold', did you mean 'threshold'?"),
        ("maxwrongrate = 0.1\n", "unknown setting 'maxwrongrate', did you mean "
                                  "'max_wrong_rate'?"),
        ("colour = 1\n", "unknown setting 'colour' (known: "),  # nothing close: no guess
        ('log_level = "LOUD"\n', "log_level must be one of DEBUG, INFO, WARNING, ERROR, "
                                 "CRITICAL, not 'LOUD'"),
        ('temperature = "hot"\n', "temperature = 'hot' is not valid: Input should be a "
                                  "valid number"),
        ('upstream = "x"\n', "upstream must be a table ([upstream])"),
        ('max_entries = "many"\n', "max_entries"),
        ("threshold = 1.5\n", "threshold: a similarity threshold must lie strictly between 0 "
                               "and 1, not 1.5"),
        ("threshold = 1.0\n", "threshold: a similarity threshold must lie strictly between 0 "
                               "and 1, not 1.0"),
        ("threshold = = 1\n", "not valid TOML"),
        ('encoder_backend = "tensorflow"\n', "encoder_backend must be one of 'onnx', 'onnx-int8', "
                                            "'torch', not 'tensorflow'"),
        ("max_entries = 0\n", "max_entries must be a positive whole number, not 0"),
        ("max_bytes = -1\n", "max_bytes must be a positive whole number, not -1"),
        ('eviction_policy = "fifo"\n', "eviction_policy 'fifo' is unknown; valid: lru, lfu, "
                                        "scalm-co, scalm-se"),
        ('verifier = "bert"\n', "verifier 'bert' is unknown; valid: rules, learned"),
        ("[upstream_sampling]\nrepeat_penalty = 1.1\n",
         "upstream_sampling has no field 'repeat_penalty' (known: dry_allowed_length, "),
        ("[upstream_sampling]\ndry_allowed_length = 2.5\n",
         "upstream_sampling.dry_allowed_length = 2.5 is not a valid int"),
        ('[upstream_sampling]\nstop_on_loops = "maybe"\n',
         "upstream_sampling.stop_on_loops = 'maybe' is not a valid bool"),
    ],
)
def test_bad_config_names_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        load_settings(config_dir=tmp_path, environ={})
    assert str(raised.value).startswith(str(tmp_path / "config.toml"))  # names the file


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MEANCACHE_CONTEXT_AWARE"):
        load_settings(config_dir=tmp_path, environ={"MEANCACHE_CONTEXT_AWARE": "maybe"})


def test_upstream_sampling_comes_from_a_table_or_the_environment(tmp_path: Path) -> None:
    write_config(tmp_path, "[upstream_sampling]\ndry_multiplier = 0\nstop_on_loops = false\n"
                           "repetition_window = 32\n")
    settings = load_settings(config_dir=tmp_path, environ={})
    assert settings.upstream_sampling == {"dry_multiplier": 0.0, "stop_on_loops": False,
                                          "repetition_window": 32}
    env = {"MEANCACHE_UPSTREAM_SAMPLING": "repetition_penalty=1.2, stop_on_loops=true"}
    assert load_settings(config_dir=tmp_path, environ=env).upstream_sampling == {
        "repetition_penalty": 1.2, "stop_on_loops": True}


def test_the_example_config_in_deploy_is_valid(tmp_path: Path) -> None:
    example = REPO / "deploy" / "config.example.toml"
    write_config(tmp_path, example.read_text())
    settings = load_settings(config_dir=tmp_path, environ={})
    assert settings.upstream_url == "http://127.0.0.1:8080"
    assert settings.keymap == {"reject": "ctrl+r", "stats": "f5"}


OPENAI_ENV = {"OPENAI_BASE_URL": "http://llm.local:8080/v1", "OPENAI_API_KEY": "sk-local"}


def test_openai_variables_name_the_upstream_only_when_nothing_else_does(
        tmp_path: Path) -> None:
    settings = load_settings(config_dir=tmp_path, environ={})
    chosen = with_upstream(settings, environ=OPENAI_ENV)
    assert (chosen.upstream_url, chosen.upstream_api_key) == ("http://llm.local:8080/v1",
                                                              "sk-local")
    flagged = with_upstream(settings, "http://mine:1/v1", None, "gemma", environ=OPENAI_ENV)
    assert (flagged.upstream_url, flagged.upstream_api_key, flagged.upstream_model) == (
        "http://mine:1/v1", None, "gemma")  # the OpenAI key never goes to another server
    write_config(tmp_path, 'upstream_url = "http://configured:2"\nupstream_api_key = "k"\n')
    configured = with_upstream(load_settings(config_dir=tmp_path, environ={}),
                               environ=OPENAI_ENV)
    assert (configured.upstream_url, configured.upstream_api_key) == ("http://configured:2",
                                                                      "k")
    embedded = with_upstream(settings, environ={"OPENAI_BASE_URL": " ", "OPENAI_API_KEY": "x"})
    assert (embedded.upstream_url, embedded.upstream_api_key) == (None, None)


SHARED_FILE = """\
upstream_model = "builtin:tiny"
encoder_model = "minilm"
max_entries = 7
data_dir = "{data}"

[upstream]
data_dir = "{upstream_data}"

[fl_server]
encoder_model = "/models/mine"
"""


def test_one_file_holds_every_side_and_each_reads_its_own(tmp_path: Path) -> None:
    """Top-level keys are the device's; a server reads the top-level keys it declares and
    its own table over them, and never sees the device's other keys."""
    write_config(tmp_path, SHARED_FILE.format(data=tmp_path / "d", upstream_data=tmp_path / "u"))
    client = load_settings(config_dir=tmp_path, environ={})
    assert (client.upstream_model, client.encoder_model, client.max_entries,
            client.data_dir) == ("builtin:tiny", "minilm", 7, tmp_path / "d")
    upstream = UpstreamSettings.load(tmp_path, environ={})
    assert (upstream.upstream_model, upstream.data_dir) == ("builtin:tiny", tmp_path / "u")
    assert upstream.origin("data_dir") == f"{tmp_path / 'config.toml'} [upstream]"
    assert upstream.origin("upstream_model") == str(tmp_path / "config.toml")
    fl_server = FlServerSettings.load(tmp_path, environ={})
    assert (fl_server.encoder_model, fl_server.data_dir) == ("/models/mine", tmp_path / "d")
    assert fl_server.checkpoint_dir == tmp_path / "d" / "fl-server" / "checkpoints"
    # the environment and flags beat a side's table as they beat the top level
    env = {"MEANCACHE_DATA_DIR": str(tmp_path / "e")}
    assert UpstreamSettings.load(tmp_path, environ=env).data_dir == tmp_path / "e"
    flagged = FlServerSettings.load(tmp_path, environ=env, encoder_model="mpnet")
    assert (flagged.encoder_model, flagged.origin("encoder_model")) == ("mpnet", FLAG)


@pytest.mark.parametrize("side", [UpstreamSettings, FlServerSettings])
def test_a_servers_table_refuses_a_key_it_does_not_have(tmp_path: Path,
                                                        side: type[SettingsBase]) -> None:
    table = side.file_table
    write_config(tmp_path, f"[{table}]\nmax_entries = 7\n")
    with pytest.raises(ConfigError, match=re.escape(
            f"{tmp_path / 'config.toml'}: [{table}] has no setting 'max_entries'")):
        side.load(tmp_path, environ={})
    assert load_settings(config_dir=tmp_path, environ={}).max_entries == 100_000


def test_a_servers_bad_value_names_the_key_and_where_it_came_from(tmp_path: Path) -> None:
    write_config(tmp_path, '[upstream]\nlog_level = "chatty"\n')
    with pytest.raises(ConfigError, match=re.escape(
            f"{tmp_path / 'config.toml'} [upstream]: log_level must be one of")):
        UpstreamSettings.load(tmp_path, environ={})
    with pytest.raises(ConfigError, match="MEANCACHE_LOG_LEVEL: log_level must be one of"):
        UpstreamSettings.load(tmp_path / "none", environ={"MEANCACHE_LOG_LEVEL": "x"})


def test_every_value_says_where_it_came_from(tmp_path: Path) -> None:
    write_config(tmp_path, "max_entries = 7\npca_dims = 32\n")
    env = {"MEANCACHE_PCA_DIMS": "16", "MEANCACHE_CONTEXT_AWARE": "off"}
    settings = load_settings(config_dir=tmp_path, environ=env, eviction_policy="lfu")
    origins = {key: origin for key, _, origin in settings.effective()}
    assert origins["max_entries"] == str(tmp_path / "config.toml")
    assert (origins["pca_dims"], settings.pca_dims) == ("MEANCACHE_PCA_DIMS", 16)
    assert origins["context_aware"] == "MEANCACHE_CONTEXT_AWARE"
    assert origins["eviction_policy"] == FLAG
    assert origins["candidates"] == origins["threshold"] == "default"
    assert origins["config_dir"] == FLAG


def test_secrets_are_never_shown(tmp_path: Path) -> None:
    write_config(tmp_path, 'upstream_api_key = "sk-secret"\n[proxy_apps]\neditor = "k1"\n')
    shown = {key: value for key, value, _ in
             load_settings(config_dir=tmp_path, environ={}).effective()}
    assert (shown["upstream_api_key"], shown["proxy_apps"]) == ("(set)", {"editor": "(set)"})
    assert "sk-secret" not in repr(shown) and "k1" not in repr(shown)


def test_the_example_config_holds_every_sides_tables(tmp_path: Path) -> None:
    write_config(tmp_path, (REPO / "deploy" / "config.example.toml").read_text())
    upstream = UpstreamSettings.load(tmp_path, environ={})
    assert (upstream.upstream_model, upstream.upstream_api_key) == ("builtin:tiny", "change-me")
    assert FlServerSettings.load(tmp_path, environ={}).encoder_model == "mpnet"
