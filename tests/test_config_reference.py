"""docs/reference/configuration.md is generated from the settings models: the committed
file is what scripts/gen_config_reference.py writes now."""

from pathlib import Path

from meancache.shared.settings import env_var
from meancache.shared.settings_reference import REFERENCE_INTRO, reference_markdown

from meancache.cli import SIDES
from tests.support.paths import REPO

REFERENCE = REPO / "docs" / "reference" / "configuration.md"


def test_the_committed_reference_is_up_to_date() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == reference_markdown(SIDES), (
        "run .venv/bin/python scripts/gen_config_reference.py")


def test_every_setting_of_every_side_is_described_with_its_variable() -> None:
    text = reference_markdown(SIDES)
    for side, model in SIDES.items():
        assert f"## {side}" in text
        for key, name in model.file_keys().items():
            assert model.model_fields[name].description, (side, key)
            assert f"| `{key}` |" in text and f"`{env_var(key)}`" in text, (side, key)


def test_the_references_example_file_is_valid_for_every_side(tmp_path: Path) -> None:
    example = REFERENCE_INTRO.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "config.toml").write_text(example)
    loaded = {side: model.load(tmp_path, environ={}) for side, model in SIDES.items()}
    assert loaded["client"].max_entries == 50000
    assert loaded["client"].keymap == {"reject": "ctrl+r"}
    assert loaded["upstream"].upstream_model == "/models/my-llm"
    assert loaded["upstream"].data_dir == Path("/srv/meancache-upstream")
    assert loaded["fl-server"].encoder_model == "minilm"
