"""Every chat action, with a binding id (remappable through `keymap` in config.toml) and
the help the command palette shows."""

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
            tooltip="Attach a text file as a Prompt Cache module"),
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
