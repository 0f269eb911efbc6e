"""The tiny random-init encoder the federated tests train (a module's worth each), and
the tiny verifier they read."""

from pathlib import Path

import pytest
from sentence_transformers import SentenceTransformer

from tests.support.tiny_encoder import make_tiny_encoder
from tests.support.tiny_verifier import built_tiny_verifier


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> SentenceTransformer:
    return SentenceTransformer(str(tiny_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_verifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny int8 verifier whose every tensor is distinct, as a trained one's are: read
    only, so one per worker, copied from the one the run builds."""
    return built_tiny_verifier(tmp_path_factory, distinct=True)
