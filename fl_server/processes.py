"""Starting Flower's own server processes (SuperLink, SuperNode, `flwr run`) for the
meancache commands, with the flags this deployment needs."""

from pathlib import Path

from meancache.shared.processes import flower_command, flower_environment

APP_DIR = Path(__file__).resolve().parents[1]  # the Flower app: pyproject.toml [tool.flwr.app]


def superlink_command(state_dir: Path, host: str, port: int, certificates: Path | None
                      ) -> list[str]:
    """The SuperLink serves Fleet, Control and ServerApp APIs on one port (flwr 1.4x)."""
    command = [flower_command("flower-superlink"), "--host", host, "--port", str(port),
               "--database", str(state_dir / "state.db"),
               "--disable-runtime-dependency-installation"]
    if certificates is None:
        return [*command, "--insecure"]
    return [*command, "--ssl-ca-certfile", str(certificates / "ca.crt"),
            "--ssl-certfile", str(certificates / "server.pem"),
            "--ssl-keyfile", str(certificates / "server.key")]


def write_connection(flwr_home: Path, superlink: str, root_certificate: Path | None) -> None:
    """The `meancache` SuperLink connection in a FLWR_HOME of our own."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    security = (f'root-certificates = "{root_certificate}"' if root_certificate
                else "insecure = true")
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "meancache"\n\n[superlink.meancache]\n'
        f'address = "{superlink}"\n{security}\n'
    )


def run_command(superlink: str, run_config: str, flwr_home: Path,
                root_certificate: Path | None) -> tuple[list[str], dict[str, str]]:
    write_connection(flwr_home, superlink, root_certificate)
    env = flower_environment(FLWR_HOME=str(flwr_home))
    command = [flower_command("flwr"), "run", str(APP_DIR), "meancache", "--stream"]
    if run_config:
        command += ["--run-config", run_config]
    return command, env
