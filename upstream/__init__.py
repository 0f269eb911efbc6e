"""LLM server with Prompt Cache module reuse."""

import meancache.shared  # noqa: F401  (sets the offline environment before any Hugging Face import)
