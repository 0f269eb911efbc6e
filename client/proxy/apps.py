"""Who is asking the proxy, and which cache namespace that app reads and writes.

The API key decides the namespace, never a header: with ``proxy_apps`` configured only
those keys are let in, each app its own namespace (``app-NAME``); without it any key is
accepted and is a namespace of its own, named by a digest of the key (``key-<sha256>``),
so no key is ever written to disk in plain text, and every request without a Bearer key
(none, or another scheme such as ``Basic``) shares one namespace (the proxy warns of it
when it starts). ``proxy_shared`` puts every app in the
one namespace ``shared``. The ``X-Meancache-App`` header only labels what an app stored
(`meancache cache list` shows it).
"""

import hashlib
import re
import secrets
from dataclasses import dataclass

from meancache.client.errors import ConfigError, ProxyRequestError

MAX_KEY_CHARS = 256
APP_HEADER = "x-meancache-app"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,63}")
SHARED = "shared"


@dataclass(frozen=True)
class App:
    label: str  # who asked, as `cache list` shows it
    namespace: str  # the cache directory it reads and writes


def key_digest(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


class Apps:
    def __init__(self, named: dict[str, str], shared: bool = False) -> None:
        """``named``: app name -> its API key (``proxy_apps``)."""
        for name, key in named.items():
            if not _NAME.fullmatch(name):
                raise ConfigError(f"proxy_apps: the app name {name[:70]!r} must be 1-64 "
                                  "letters, digits, '.', '_' or '-'")
            if not key or len(key) > MAX_KEY_CHARS:
                raise ConfigError(f"proxy_apps: the key of {name!r} must have 1 to "
                                  f"{MAX_KEY_CHARS} characters")
        if len(set(named.values())) < len(named):
            raise ConfigError("proxy_apps: two apps have the same key; give each its own")
        self._named = dict(named)
        self.shared = shared

    def identify(self, authorization: str, label: str | None) -> App:
        """The app sending ``authorization`` (the header's value) and ``label`` (its
        X-Meancache-App header, if any); a 401 for a key the proxy does not know."""
        scheme, _, key = authorization.partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else ""
        if len(key) > MAX_KEY_CHARS:
            raise ProxyRequestError(401, f"the API key has over {MAX_KEY_CHARS} characters",
                                    "invalid_api_key", kind="authentication_error")
        if label is not None and not _LABEL.fullmatch(label):
            raise ProxyRequestError(400, f"the {APP_HEADER} header must be 1-64 letters, "
                                    "digits, spaces, '.', '_' or '-'", "invalid_app_name")
        if self._named:
            name = self._find(key) if key else None
            if name is None:
                raise ProxyRequestError(401, _refusal(scheme, key), "invalid_api_key",
                                        kind="authentication_error")
            return App(label or name, SHARED if self.shared else f"app-{name}")
        namespace = key_digest(key)
        return App(label or namespace, SHARED if self.shared else namespace)

    def keyless_warning(self) -> str | None:
        """What to warn of at start when no key is required (None when one is)."""
        if self._named:
            return None
        return ("no proxy_apps are configured: any API key is let in, and requests with no "
                "Bearer key share one cache; set proxy_apps to admit only your apps' keys")

    def _find(self, key: str) -> str | None:
        """The app of ``key``; every key is compared in constant time."""
        found = None
        for name, known in self._named.items():
            if secrets.compare_digest(key.encode(), known.encode()):
                found = name
        return found


def _refusal(scheme: str, key: str) -> str:
    """Why a request's Authorization let it in to no app of ``proxy_apps``."""
    if not scheme:
        return ("no API key: this proxy admits only the keys proxy_apps names; send "
                "'Authorization: Bearer KEY'")
    if scheme.lower() != "bearer":
        return (f"the Authorization header uses the {scheme[:20]!r} scheme; this proxy "
                "takes only 'Authorization: Bearer KEY' with a key proxy_apps names")
    if not key:
        return "the Bearer key is empty; send 'Authorization: Bearer KEY'"
    return "unknown API key: send 'Authorization: Bearer KEY' with a key proxy_apps names"
