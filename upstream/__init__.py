"""LLM server with Prompt Cache module reuse (see issue: upstream)."""
