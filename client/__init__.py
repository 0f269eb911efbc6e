"""The on-device side of meancache: semantic cache, CLI and (later) the chat app."""
