"""Publishing a simulation's global model to this machine's FL server, so that `meancache
fl server` serves it and a new user's `meancache fl sync` installs it.

The simulation signs its checkpoints with a key of its own; devices trust the FL server's
key. So the newest simulated round is checked against its sha256 and saved again as the
server's next round (after any it has), signed with the server's key. A later `fl run`
continues from it, as from any round of the server's.
"""

from functools import partial
from pathlib import Path

from meancache.shared.errors import CheckpointError
from meancache.shared.fl.checkpoint import (
    GlobalModel,
    latest_checkpoint,
    load_checkpoint,
    read_meta,
    save_checkpoint,
)
from meancache.shared.fl.signing import server_key, sign


def publish(simulation_dir: Path, server_dir: Path) -> GlobalModel:
    """The newest global model under ``simulation_dir``, installed as the newest round
    under ``server_dir`` (the server's checkpoints); returns what was installed."""
    latest = latest_checkpoint(simulation_dir)
    if latest is None:
        raise CheckpointError(f"{simulation_dir} holds no global model to publish; run "
                              "`meancache fl simulate` with at least one round first")
    meta, state = load_checkpoint(latest)
    current = latest_checkpoint(server_dir)
    number = meta.round if current is None else max(meta.round, read_meta(current).round + 1)
    return save_checkpoint(server_dir, number, state, meta.threshold, meta.base_model,
                           meta.top_layers, meta.metrics,
                           partial(sign, key=server_key(server_dir)),
                           verifier_base=meta.verifier_base, bound=meta.bound,
                           cosine_bound=meta.cosine_bound)
