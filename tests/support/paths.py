"""Where the tests find the repository and the shared data beside it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO.parent / "shared" / "data"  # the read-only shared data (never copied in)
TEST_DATA = REPO / "tests" / "data"  # data written for the tests (the near-miss set)


def data_dir_linking(data: Path, encoder_dir: Path) -> Path:
    """``data`` made a fresh data dir whose encoder/ is ``encoder_dir`` (the session's
    device encoder: exported and quantised once per run, never in a test)."""
    data.mkdir(parents=True)
    (data / "encoder").symlink_to(encoder_dir, target_is_directory=True)
    return data
