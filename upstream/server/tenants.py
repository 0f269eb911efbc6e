"""Who is asking: each API key is a tenant that owns the PML schemas it registers (the
engine keeps them apart, see PromptCacheEngine); a server without keys, in loopback dev
mode, has the one tenant LOCAL_TENANT."""

import hashlib
import secrets
from collections.abc import Iterable

from meancache.upstream.prompt_cache.engine import LOCAL_TENANT
from starlette.requests import Request
from starlette.types import Scope

_SCOPE_KEY = "meancache.tenant"
MAX_KEY_CHARS = 256  # an API key's length: a longer bearer token is refused unread


def tenant_id(api_key: str) -> str:
    """A tenant's name: a digest of its key, so neither logs nor memory dumps of the
    engine's maps carry the key itself."""
    return "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


class Tenants:
    """The server's API keys and the tenant each one is."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._by_key = {key: tenant_id(key) for key in keys if key}
        too_long = [key for key in self._by_key if len(key) > MAX_KEY_CHARS]
        if too_long:
            raise ValueError(f"an API key has at most {MAX_KEY_CHARS} characters")

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def identify(self, token: str) -> str | None:
        """The tenant of a bearer token, or None; every key is compared in constant time."""
        if len(token) > MAX_KEY_CHARS:
            return None
        found = None
        for key, tenant in self._by_key.items():
            if secrets.compare_digest(token.encode(), key.encode()):
                found = tenant
        return found


def set_tenant(scope: Scope, tenant: str) -> None:
    scope[_SCOPE_KEY] = tenant


def tenant_of(request: Request) -> str:
    """The tenant the auth middleware found for ``request`` (LOCAL_TENANT without keys)."""
    return str(request.scope.get(_SCOPE_KEY, LOCAL_TENANT))
