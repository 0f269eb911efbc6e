"""Optional packages: the chat's install leaves the operator's and the benchmarks' tools
out, so code that needs one checks first and names the extra that brings it."""

import importlib.util

from meancache.shared.errors import MissingExtraError


def require(module: str, extra: str, purpose: str) -> None:
    """Raise a one-line :class:`MissingExtraError` when ``module`` is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:  # None, or a stray directory of that name
        raise MissingExtraError(f"{purpose} needs {module}, which is not installed: it comes "
                                f"with meancache's {extra} extra (pip install -e '.[{extra}]' "
                                "in the meancache checkout)")
