"""How a device reaches the FL server: TLS whenever a root certificate is configured, and a
plain connection to anything but this machine only when the user says ``--insecure`` (or
``fl_insecure = true``) explicitly, with a warning: over plain HTTP or gRPC anyone on the
path reads the weights and can swap the global model."""

import logging
import ssl
import sys
from pathlib import Path
from urllib.parse import urlsplit

from meancache.client.errors import ConfigError
from meancache.shared.processes import is_loopback

log = logging.getLogger(__name__)


def _host_of(superlink: str) -> str:
    """The host of HOST:PORT (IPv6 in brackets)."""
    return urlsplit(f"//{superlink}").hostname or superlink


def check_plain(address: str, host: str, insecure: bool) -> None:
    """Refuse (ConfigError) a plain connection to ``host`` unless it is loopback or the
    user asked for it; warn when they did."""
    if is_loopback(host):
        return
    if not insecure:
        raise ConfigError(f"refusing a plain (unencrypted) connection to {address}: set "
                          "fl_root_certificate (or pass --root-certificate) to the FL "
                          "server's CA certificate for TLS, or pass --insecure if you accept "
                          "that anyone on the network can read and change what is sent")
    warning = (f"warning: connecting to {address} without TLS (--insecure): the global model "
               "and this device's updates can be read and changed on the way")
    log.warning(warning)
    print(warning, file=sys.stderr, flush=True)


def superlink_tls(superlink: str, root_certificate: Path | None, insecure: bool
                  ) -> Path | None:
    """The root certificate for the SuperNode's TLS, or None for a plain connection the
    user allowed (or to loopback). Checked here, before the SuperNode starts: Flower's own
    reading of a SuperLink without a port, or of a file that is no certificate, ended the
    SuperNode with its exit code 600, or in a traceback and a wait for a timeout."""
    parts = urlsplit(f"//{superlink}")
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = None
    if not port or not parts.hostname:
        raise ConfigError(f"--superlink {superlink!r} is not HOST:PORT (e.g. 127.0.0.1:9092, "
                          "or [::1]:9092 for IPv6)")
    if root_certificate is None:
        check_plain(superlink, _host_of(superlink), insecure)
    else:
        _ca_context(root_certificate)
    return root_certificate


def _ca_context(root_certificate: Path) -> ssl.SSLContext:
    """A TLS context trusting ``root_certificate`` alone, or a ConfigError naming it."""
    try:
        return ssl.create_default_context(cafile=str(root_certificate))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read the root certificate {root_certificate}: {exc}"
                          ) from None


def http_verify(url: str, root_certificate: Path | None, insecure: bool
                ) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for the global-model endpoint: the configured CA for https, the
    system's without one; a plain http URL must pass ``check_plain``."""
    parts = urlsplit(url)
    if parts.scheme == "http":
        check_plain(url, parts.hostname or "", insecure)
        return True
    if root_certificate is None:
        return True
    return _ca_context(root_certificate)
