"""Turning HTTP failures into sentences for the user (shared by every HTTP client here)."""

import httpx


def describe(exc: Exception) -> str:
    """A transport error's message (some httpx errors have none but their type)."""
    return str(exc) or type(exc).__name__


def error_message(response: httpx.Response) -> str:
    """The server's own error message: OpenAI-style {"error": {"message"}}, or the body."""
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except (ValueError, AttributeError):
        pass
    return response.text[:200] or response.reason_phrase
