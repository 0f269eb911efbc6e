"""This user's Flower SuperNode: the process through which the device takes part in
federated rounds (`meancache fl join`, or F8 in the chat app)."""

import subprocess
from pathlib import Path

from meancache.shared.processes import flower_command, flower_environment


def supernode_command(superlink: str, port: int, data_dir: Path,
                      root_certificate: Path | None) -> list[str]:
    """flower-supernode training on ``data_dir`` (the ClientApp reads it from node config)."""
    command = [flower_command("flower-supernode"), "--superlink", superlink,
               "--port", str(port), "--node-config", f"data-dir='{data_dir}'"]
    if root_certificate is None:
        return [*command, "--insecure"]
    return [*command, "--root-certificates", str(root_certificate)]


def supernode_environment(data_dir: Path) -> dict[str, str]:
    return flower_environment(MEANCACHE_DATA_DIR=str(data_dir))


def start_supernode(superlink: str, port: int, data_dir: Path,
                    root_certificate: Path | None, log_file: Path) -> "subprocess.Popen[bytes]":
    """Start the SuperNode in the background, its output going to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            supernode_command(superlink, port, data_dir, root_certificate),
            env=supernode_environment(data_dir), stdout=log, stderr=subprocess.STDOUT)
