"""Starting Flower's own server processes (SuperLink, `flwr run`) for the meancache
commands, with the flags this deployment needs."""

from pathlib import Path

import tomli_w
from meancache.shared.errors import FlowerCommandError
from meancache.shared.processes import flower_command, flower_environment

CONNECTION = "meancache"  # the SuperLink connection's name in our own FLWR_HOME


def superlink_command(state_dir: Path, host: str, port: int, certificates: Path | None,
                      simulation: bool = False, supernode_auth: bool = False) -> list[str]:
    """The SuperLink serves Fleet, Control and ServerApp APIs on one port (flwr 1.4x);
    with ``simulation`` it runs each run's ServerApp and ClientApps on the simulation
    engine instead of waiting for SuperNodes; with ``supernode_auth`` only SuperNodes
    whose public key was registered (`flwr supernode register`) may connect (needs TLS)."""
    if supernode_auth and certificates is None:
        raise FlowerCommandError("SuperNode authentication needs TLS: pass --certificates "
                                 "too (deploy/make-certificates.sh makes them)")
    command = [flower_command("flower-superlink"), "--host", host, "--port", str(port),
               "--database", str(state_dir / "state.db"),
               "--disable-runtime-dependency-installation"]
    if simulation:
        command.append("--simulation")
    if supernode_auth:
        command.append("--enable-supernode-auth")
    if certificates is None:
        return [*command, "--insecure"]
    ca, chain, key = check_certificates(certificates)
    return [*command, "--ssl-ca-certfile", str(ca), "--ssl-certfile", str(chain),
            "--ssl-keyfile", str(key)]


def check_certificates(certificates: Path) -> tuple[Path, Path, Path]:
    """The CA certificate, the server's certificate and its key in ``certificates``
    (deploy/make-certificates.sh's names), read as TLS will read them; refused in words
    before anything starts (a missing one ended `fl server` in a FileNotFoundError
    traceback)."""
    import ssl

    ca, chain, key = (certificates / name for name in ("ca.crt", "server.pem", "server.key"))
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        context.load_cert_chain(str(chain), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise FlowerCommandError(f"--certificates {certificates}: cannot use ca.crt, "
                                 f"server.pem and server.key there ({exc}); make them with "
                                 "deploy/make-certificates.sh") from None
    return ca, chain, key


def write_connection(flwr_home: Path, superlink: str, root_certificate: Path | None) -> None:
    """The `meancache` SuperLink connection in a FLWR_HOME of our own."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    connection: dict[str, str | bool] = {"address": superlink}
    if root_certificate:
        connection["root-certificates"] = str(root_certificate)
    else:
        connection["insecure"] = True
    config = {"superlink": {"default": CONNECTION, CONNECTION: connection}}
    (flwr_home / "config.toml").write_text(tomli_w.dumps(config), encoding="utf-8")


def run_command(app: Path, superlink: str, run_config: str, flwr_home: Path,
                root_certificate: Path | None, federation_config: str = ""
                ) -> tuple[list[str], dict[str, str]]:
    """`flwr run` of the Flower app in ``app`` on ``superlink``, streaming the run's logs
    until it ends. ``run_config``: overrides ("key=value ..." or a .toml file);
    ``federation_config``: a simulation's ("num-supernodes=20 ...")."""
    write_connection(flwr_home, superlink, root_certificate)
    env = flower_environment(FLWR_HOME=str(flwr_home))
    command = [flower_command("flwr"), "run", str(app), CONNECTION, "--stream"]
    if run_config:
        command += ["--run-config", run_config]
    if federation_config:
        command += ["--federation-config", federation_config]
    return command, env
