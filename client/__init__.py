"""The on-device side of meancache: semantic cache, chat, CLI and federated learning."""

import meancache.shared  # noqa: F401  (sets the offline environment before any Hugging Face import)
