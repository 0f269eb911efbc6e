"""This user's Flower SuperNode: the process through which the device takes part in
federated rounds (`meancache fl join`, or F8 in the chat app)."""

import subprocess
from pathlib import Path

import tomli_w
from meancache.client.errors import ConfigError
from meancache.client.fl.transport import superlink_tls
from meancache.shared.errors import AppSignatureError
from meancache.shared.fl.app_signing import read_app_public_key, write_trusted_entities
from meancache.shared.processes import flower_command, flower_environment


def write_node_config(data_dir: Path) -> Path:
    """The SuperNode's node config as a TOML file (any path survives quoting): the
    ClientApp reads this user's data dir from it."""
    path = data_dir / "fl" / "node-config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({"data-dir": str(data_dir)}), encoding="utf-8")
    return path


def trusted_entities(data_dir: Path, app_key: str | None, allow_unsigned_apps: bool
                     ) -> Path | None:
    """flwr's ``--trusted-entities`` file trusting the operator's app key, so the node runs
    only apps the operator signed; None only for a lab that allows unsigned apps."""
    if app_key:
        try:
            public = read_app_public_key(app_key)
        except AppSignatureError as exc:
            raise ConfigError(str(exc)) from None
        return write_trusted_entities(data_dir / "fl" / "trusted-entities.yaml", public)
    if allow_unsigned_apps:
        return None
    raise ConfigError("no operator app key: set fl_app_public_key (or pass --app-key) to the "
                      "operator's app-signing-key.pub, so this device runs only apps the "
                      "operator signed (`meancache fl sign-app`), or pass --allow-unsigned-apps "
                      "(fl_allow_unsigned_apps) to run whatever app the FL server hands out")


def supernode_command(superlink: str, port: int, data_dir: Path,
                      root_certificate: Path | None, insecure: bool = False,
                      auth_key: Path | None = None, trusted: Path | None = None) -> list[str]:
    """flower-supernode training on ``data_dir`` (the ClientApp reads it from node config):
    TLS with ``root_certificate``; without one, only to loopback or when ``insecure``.
    ``auth_key``: this device's private key, for a SuperLink that admits registered keys
    only; ``trusted``: the trusted-entities file (``trusted_entities``)."""
    root_certificate = superlink_tls(superlink, root_certificate, insecure)
    command = [flower_command("flower-supernode"), "--superlink", superlink,
               "--port", str(port), "--node-config", str(write_node_config(data_dir))]
    if trusted is not None:
        command += ["--trusted-entities", str(trusted)]
    if auth_key is not None:
        command += ["--auth-supernode-private-key", str(auth_key)]
    if root_certificate is None:
        return [*command, "--insecure"]
    return [*command, "--root-certificates", str(root_certificate)]


def supernode_environment(data_dir: Path) -> dict[str, str]:
    """Flower keeps what it installs for a run under FLWR_HOME: this user's data dir, never
    ~/.flwr."""
    return flower_environment(MEANCACHE_DATA_DIR=str(data_dir),
                              FLWR_HOME=str(data_dir / "fl" / "flwr-home"))


def start_supernode(superlink: str, port: int, data_dir: Path,
                    root_certificate: Path | None, log_file: Path, insecure: bool = False,
                    trusted: Path | None = None) -> "subprocess.Popen[bytes]":
    """Start the SuperNode in the background, its output going to ``log_file``."""
    command = supernode_command(superlink, port, data_dir, root_certificate, insecure,
                                trusted=trusted)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command,
            env=supernode_environment(data_dir), stdout=log, stderr=subprocess.STDOUT)
