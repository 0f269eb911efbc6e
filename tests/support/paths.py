"""Where the tests find the repository and the shared data beside it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO.parent / "shared" / "data"  # the read-only shared data (never copied in)
TEST_DATA = REPO / "tests" / "data"  # data written for the tests (the near-miss set)
