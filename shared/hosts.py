"""Which names the server answers to. A server on loopback is still reachable from any
web page the user opens: DNS rebinding points the page's own name at 127.0.0.1, and the
browser then sends that name in the Host header. Answering only loopback names stops it."""

import argparse
import ipaddress
import re

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


# A Host header as RFC 9110 allows it: a DNS name or IPv4 address, or an IPv6 address in
# brackets, then an optional port. Anything else (spaces, a second colon, a non-numeric
# port, userinfo) is refused rather than guessed at.
_HOST = re.compile(r"(?P<name>\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?)"
                   r"(?::(?P<port>[0-9]{1,5}))?")


def host_name(header: str) -> str | None:
    """The name in a Host header, lower-cased, without its port (``[::1]:80`` ->
    ``[::1]``); None when the header is not a well-formed host."""
    found = _HOST.fullmatch(header.lower())
    if found is None or (found["port"] is not None and int(found["port"]) > 65535):
        return None
    name = found["name"]
    if name.startswith("["):
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    return name


def is_loopback(address: str) -> bool:
    """Whether a listen address is reachable only from this machine."""
    if address.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def open_server_warning(address: str, has_keys: bool) -> str | None:
    """What to tell the operator of a server anyone on the network may use, if it is one."""
    if has_keys or is_loopback(address):
        return None
    return (f"warning: serving on {address} without an API key: anyone who can reach this "
            "address can run the model and register schemas; pass --api-key KEY")


def port_argument(value: str) -> int:
    """A command's --port: a TCP port from 1 to 65535, refused by argparse before anything
    loads (port 0 would listen on a port the OS picks and nobody is told)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:20]!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is not a port; give one from 1 to 65535")
    return port
