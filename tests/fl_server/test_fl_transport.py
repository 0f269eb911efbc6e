"""A device reaches the FL server over TLS whenever a root certificate is configured, and
never plainly to another host unless the user says --insecure (and is warned)."""

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from meancache.client.config import Settings, load_settings
from meancache.client.errors import ConfigError, SyncError
from meancache.client.fl.supernode import supernode_command
from meancache.client.fl.sync import sync_global_model
from meancache.fl_server.model_endpoint import create_model_app
from meancache.fl_server.processes import check_certificates
from meancache.shared.fl.signing import PUBLIC_KEY
from meancache.shared.processes import free_port

from meancache.cli import main
from tests.support.fl import publish
from tests.support.paths import REPO

REMOTE = "203.0.113.7"  # TEST-NET-3: never reached, the refusal comes first
SCRIPT = REPO / "deploy" / "make-certificates.sh"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """A device trusting the key of the FL server under tmp_path/server (see https_url)."""
    return load_settings(config_dir=tmp_path / "cfg", data_dir=tmp_path / "data", environ={},
                         encoder_model="minilm",
                         fl_server_public_key=str(tmp_path / "server" / PUBLIC_KEY))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(SCRIPT), str(out)], check=True, capture_output=True)
    return out


def test_a_supernode_never_connects_plainly_to_another_host(
    settings: Settings, certificates: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=f"refusing a plain .unencrypted. connection to "
                                          f"{REMOTE}:9092.*--insecure"):
        supernode_command(f"{REMOTE}:9092", 9094, settings.data_dir, None)
    with_tls = supernode_command(f"{REMOTE}:9092", 9094, settings.data_dir,
                                 certificates / "ca.crt")
    assert with_tls[-2:] == ["--root-certificates", str(certificates / "ca.crt")]
    assert "--insecure" not in with_tls
    local = supernode_command("127.0.0.1:9092", 9094, settings.data_dir, None)
    assert local[-1] == "--insecure"  # this machine's own server
    assert "without TLS" not in capsys.readouterr().err
    allowed = supernode_command(f"{REMOTE}:9092", 9094, settings.data_dir, None, insecure=True)
    assert allowed[-1] == "--insecure"
    assert "warning: connecting to 203.0.113.7:9092 without TLS" in capsys.readouterr().err


def test_fl_join_and_sync_refuse_plain_remote_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    data = ["--data-dir", str(tmp_path / "data")]
    assert main([*data, "fl", "join", "--superlink", f"{REMOTE}:9092",
                 "--allow-unsigned-apps"]) == 2
    assert "refusing a plain (unencrypted) connection" in capsys.readouterr().err
    assert main([*data, "fl", "sync", "--server", f"http://{REMOTE}:9100"]) == 2
    assert "pass --insecure" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(("extra", "said"), [
    (["--superlink", "127.0.0.1"], "--superlink '127.0.0.1' is not HOST:PORT"),
    (["--superlink", "127.0.0.1:port"], "--superlink '127.0.0.1:port' is not HOST:PORT"),
    (["--superlink", ":9092"], "--superlink ':9092' is not HOST:PORT"),
    (["--root-certificate", "{cert}"], "cannot read the root certificate {cert}: [X509"),
    (["--root-certificate", "{missing}"], "cannot read the root certificate {missing}: "
                                          "[Errno 2] No such file or directory"),
], ids=["no-port", "port-word", "no-host", "not-a-certificate", "missing-certificate"])
def test_fl_join_names_a_superlink_or_certificate_it_cannot_use_before_starting(
        tmp_path: Path, extra: list[str], said: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SuperNode was started anyway: it ended with Flower's exit code 600 on a
    SuperLink without a port, and on a file that is no certificate it logged a
    UnicodeDecodeError traceback and waited until killed."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    cert, missing = tmp_path / "ca.crt", tmp_path / "none.crt"
    cert.write_bytes(bytes(range(256)))
    fill = {"cert": cert, "missing": missing}
    argv = ["--data-dir", str(tmp_path / "data"), "fl", "join", "--allow-unsigned-apps",
            *(part.format(**fill) for part in extra)]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said.format(**fill) in err
    assert "training on" not in err  # nothing was said to start
    assert not (tmp_path / "data" / "fl").exists()  # nor written: no node config


def test_fl_server_names_certificates_or_signatures_it_cannot_use_before_starting(
        tmp_path: Path, certificates: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing ca.crt, server.pem or server.key ended `fl server` in a traceback; a file
    given as the signatures' folder served, and no device could run an app."""
    assert check_certificates(certificates) == tuple(
        certificates / name for name in ("ca.crt", "server.pem", "server.key"))
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("ca.crt", "server.pem"):  # the key is missing
        (partial / name).write_bytes((certificates / name).read_bytes())
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    for name, source in (("ca.crt", "ca.crt"), ("server.pem", "server.pem"),
                         ("server.key", "ca.crt")):  # no private key where the key goes
        (swapped / name).write_bytes((certificates / source).read_bytes())
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    for bad, why in ((partial, "No such file or directory"), (swapped, "PEM lib")):
        assert main(["--data-dir", str(tmp_path / "data"), "fl", "server", "--certificates",
                     str(bad), "--port", str(free_port()), "--control-port",
                     str(free_port()), "--model-port", str(free_port())]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"--certificates {bad}: cannot use ca.crt, server.pem and server.key" in err
        assert why in err and "Fleet API" not in err  # refused before it said it serves
    signatures = tmp_path / "signatures.json"  # a file where the folder goes
    signatures.write_text("{}")
    assert main(["--data-dir", str(tmp_path / "data"), "fl", "server", "--app-signatures",
                 str(signatures), "--port", str(free_port()), "--control-port",
                 str(free_port()), "--model-port", str(free_port())]) == 2
    assert f"--app-signatures {signatures} is not a directory" in \
        " ".join(capsys.readouterr().err.split())


@pytest.fixture
def https_url(tmp_path: Path, certificates: Path) -> Iterator[str]:
    """The global-model endpoint over HTTPS, as `meancache fl server --certificates` runs
    it."""
    publish(tmp_path / "server", 1, 0.8)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        create_model_app(tmp_path / "server"), host="127.0.0.1", port=port, log_config=None,
        access_log=False, lifespan="off", ws="none",
        ssl_certfile=str(certificates / "server.pem"),
        ssl_keyfile=str(certificates / "server.key")))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    yield f"https://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_sync_over_https_trusts_the_configured_certificate(
    https_url: str, settings: Settings, certificates: Path
) -> None:
    with pytest.raises(SyncError, match="CERTIFICATE_VERIFY_FAILED"):
        sync_global_model(https_url, settings)  # the system's CAs do not know this server
    trusting = settings.model_copy(update=dict(fl_root_certificate=str(certificates / "ca.crt")))
    result = sync_global_model(https_url, trusting)
    assert result.round == 1 and result.changed
