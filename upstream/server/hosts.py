"""Which names the server answers to. A server on loopback is still reachable from any
web page the user opens: DNS rebinding points the page's own name at 127.0.0.1, and the
browser then sends that name in the Host header. Answering only loopback names stops it."""

import ipaddress

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


def host_name(header: str) -> str:
    """The name in a Host header, without the port, lower-cased (``[::1]:80`` -> ``[::1]``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.partition(":")[0]


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
