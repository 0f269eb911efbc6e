"""The data dir is the user's alone: what meancache creates there is owner-only, and a
data dir that another user owns or can write to is refused with a clear message."""

import os
import stat
from pathlib import Path

import pytest

from meancache.cli import main


def modes(root: Path) -> dict[str, int]:
    """Permission bits of everything under ``root`` (the shared encoder link left out)."""
    found = {}
    for path in root.rglob("*"):
        if path.is_symlink() or path.name == "encoder" or "encoder" in path.parts:
            continue
        found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return found


def test_everything_meancache_creates_is_owner_only(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    assert main(["cache", "demo"]) == 0
    export = tmp_path / "export.jsonl"
    assert main(["cache", "export", str(export)]) == 0
    created = modes(data_dir)
    assert {"logs/meancache.log", "demo-cache", "cache"} <= set(created)
    assert any(name.startswith("cache/") for name in created)  # DiskCache's own files
    for name, mode in created.items():
        expected = 0o700 if (data_dir / name).is_dir() else 0o600
        assert mode == expected, f"{name} is {mode:o}"
    assert stat.S_IMODE(export.stat().st_mode) == 0o600
    fresh = tmp_path / "new" / "data"
    assert main(["--data-dir", str(fresh), "cache", "stats"]) == 0
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert os.umask(umask) == umask  # the command left this process's umask as it was


def test_a_data_dir_others_can_write_is_refused(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir.chmod(0o777)
    assert main(["cache", "stats"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "can be written by other users (mode 777)" in err and "chmod 700" in err
    assert "Traceback" not in err
    assert not (data_dir / "logs").exists()  # nothing was read or written there


def test_a_data_dir_of_another_user_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "config"))
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    if os.getuid() == 0:
        os.chown(theirs, 4242, 4242)
    else:  # a directory root owns stands in for another user's
        theirs = Path("/")
    assert main(["--data-dir", str(theirs), "cache", "stats"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "belongs to another user" in err and "--data-dir" in err
