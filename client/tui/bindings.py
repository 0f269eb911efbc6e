"""Every chat action, with a binding id (remappable through `keymap` in config.toml), the
help the command palette shows, and when it can act."""

from meancache.client.chat.conversations import Conversation
from meancache.client.config import Settings
from textual.binding import Binding

CHAT_BINDINGS = [
    Binding("ctrl+r", "reject", "Wrong answer", id="reject",
            tooltip="Re-ask the upstream and replace this cached (or empty) answer; a cached "
                    "one re-tunes the threshold"),
    Binding("escape", "cancel", "Stop", id="cancel", tooltip="Stop the answer being streamed"),
    Binding("ctrl+n", "new_chat", "New chat", id="new_chat", tooltip="Start a new chat"),
    Binding("ctrl+o", "conversations", "Chats", id="conversations",
            tooltip="Open, delete or export past chats"),
    Binding("ctrl+l", "attach", "Attach", id="attach",
            tooltip="Attach a text file to this chat (a module on a meancache upstream)"),
    Binding("ctrl+s", "export", "Export", id="export",
            tooltip="Export this chat as Markdown"),
    Binding("ctrl+t", "stats", "Stats", id="stats", tooltip="Hit rate, thresholds, sizes"),
    Binding("f6", "pack_update", "Update pack", id="pack_update",
            tooltip="Download the upstream's newest instruction pack (answered on the device)"),
    Binding("f7", "fl_sync", "Sync model", id="fl_sync",
            tooltip="Download the newest federated global model (needs fl_server_url)"),
    Binding("f8", "fl_join", "Join FL", id="fl_join",
            tooltip="Train in federated rounds on this device's feedback (needs fl_superlink); "
                    "press again to leave"),
]
ACTIONS = frozenset(binding.action for binding in CHAT_BINDINGS)


def why_not(action: str, *, started: bool, busy: bool, conversation: Conversation,
            settings: Settings) -> str | None:
    """Why the chat action ``action`` cannot act now, or None when it can (``started``:
    the session is open; ``busy``: an answer is streaming)."""
    if action == "cancel":
        return None if busy else "nothing to stop: no answer is streaming"
    if action not in ACTIONS:
        return None
    if not started:
        return "still starting: the cache and the upstream are loading"
    if action == "reject":
        return _why_not_reject(busy, conversation)
    if action == "new_chat" and not conversation.turns:
        return "this chat is already new"
    if action == "export" and not conversation.turns:
        return "nothing to export yet: ask a question first"
    if action == "fl_sync" and not settings.fl_server_url:
        return "no federated server: set fl_server_url in config.toml"
    if action == "fl_join" and not settings.fl_superlink:
        return "no federated rounds to join: set fl_superlink in config.toml"
    return None


def _why_not_reject(busy: bool, conversation: Conversation) -> str | None:
    if busy:
        return "an answer is streaming: wait for it, or press esc to stop it"
    if not conversation.turns:
        return "nothing to reject: no answer yet"
    if not conversation.turns[-1].rejectable:  # the one rule: client/matching/origins.py
        return ("nothing to reject: this answer came from the model, not from a cache "
                "(only cached or empty answers can be marked wrong)")
    return None
