"""Settings precedence: defaults < config.toml < MEANCACHE_* < flags; clear errors."""

from dataclasses import asdict, replace
from pathlib import Path

import platformdirs
import pytest
from meancache.client.cache import CacheSettings
from meancache.client.config import Settings, load_settings, with_upstream
from meancache.client.errors import ConfigError
from meancache.shared.threshold import DEFAULT_THRESHOLD, MPNET_THRESHOLD

from tests.support.paths import REPO


def write_config(config_dir: Path, text: str) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.toml").write_text(text)


def test_defaults_use_platform_dirs_when_nothing_is_set(tmp_path: Path) -> None:
    settings = load_settings(config_dir=tmp_path, environ={})
    assert settings.encoder_model == "mpnet"
    assert settings.threshold == MPNET_THRESHOLD != DEFAULT_THRESHOLD
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
    assert load_settings(config_dir=tmp_path, environ=env).threshold == threshold
    assert load_settings(config_dir=tmp_path, environ=env, threshold=0.5).threshold == 0.5
    write_config(tmp_path, "threshold = 0.75\n")
    assert load_settings(config_dir=tmp_path, environ=env).threshold == 0.75


def test_the_cache_is_given_every_cache_setting_and_shares_its_defaults(
        tmp_path: Path) -> None:
    settings = Settings(tmp_path, tmp_path / "data")
    assert settings.cache_settings() == CacheSettings()
    changed = {"threshold": 0.9, "context_aware": False, "verify_hits": False,
               "entry_thresholds": False, "max_entries": 7, "max_bytes": 9,
               "eviction_policy": "lfu", "pattern_clustering": "dbscan", "pca_dims": 0,
               "pca_min_entries": 3, "tune_min_per_class": 2, "verifier": "rules"}
    expected = {("global_threshold" if name == "threshold" else name): value
                for name, value in changed.items()}
    got = asdict(replace(settings, **changed).cache_settings())
    assert got == asdict(CacheSettings()) | expected
    # the others are the user's to set; the recall margin goes with the learned verifier
    assert set(got) - set(expected) == {"candidates", "recall_margin"}


def test_toml_then_environment_then_flags(tmp_path: Path) -> None:
    write_config(tmp_path, f'threshold = 0.9\nmax_entries = 7\ndata_dir = "{tmp_path / "d1"}"\n')
    settings = load_settings(config_dir=tmp_path, environ={})
    assert (settings.threshold, settings.max_entries) == (0.9, 7)
    assert settings.data_dir == tmp_path / "d1"

    env = {"MEANCACHE_THRESHOLD": "0.8", "MEANCACHE_CONTEXT_AWARE": "off",
           "MEANCACHE_DATA_DIR": str(tmp_path / "d2")}
    settings = load_settings(config_dir=tmp_path, environ=env)
    assert settings.threshold == 0.8
    assert settings.context_aware is False
    assert settings.max_entries == 7
    assert settings.data_dir == tmp_path / "d2"

    settings = load_settings(config_dir=tmp_path, data_dir=tmp_path / "d3", environ=env,
                             threshold=0.75)
    assert settings.threshold == 0.75
    assert settings.data_dir == tmp_path / "d3"


def test_config_dir_from_environment(tmp_path: Path) -> None:
    write_config(tmp_path / "cfg", "pca_dims = 32\n")
    settings = load_settings(environ={"MEANCACHE_CONFIG_DIR": str(tmp_path / "cfg")})
    assert settings.pca_dims == 32
    assert settings.config_file == tmp_path / "cfg" / "config.toml"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("treshold = 0.9\n", "unknown setting 'treshold'"),
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
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        load_settings(config_dir=tmp_path, environ={})


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
