"""The upstream's HTTP API: OpenAI-compatible chat completions plus PML schemas."""
