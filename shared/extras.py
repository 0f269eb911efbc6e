"""Optional packages: the chat's install leaves the operator's and the benchmarks' tools
out, so code that needs one checks first and names the extra that brings it."""

import importlib.util

from meancache.shared.errors import MissingExtraError


def require(module: str, extra: str, purpose: str) -> None:
    """Raise a one-line :class:`MissingExtraError` when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(f"{purpose} needs {module}, which is not installed: "
                                f"pip install 'meancache[{extra}]'")
