"""What the empty chat says first: which model answers and how to use another. A new user
must know what they are talking to: the embedded default is a small base model whose
answers are often wrong, and any OpenAI-compatible server can take its place."""

from meancache.client.config import Settings
from meancache.shared.settings import EMBEDDED_MODEL

HOW_TO_CHANGE = ("To use another model, start the chat with --upstream URL (any "
                 "OpenAI-compatible server: llama.cpp, Ollama, vLLM; --model NAME picks "
                 "one of its models) or set OPENAI_BASE_URL.")


def welcome(settings: Settings) -> str:
    """The empty chat's first lines, from the settings alone: shown while the chat starts
    (a first start takes a minute), before the upstream is checked or started."""
    model = settings.upstream_model if settings.upstream_url else settings.embedded_model
    if settings.upstream_url:
        asked = f"the model {model}" if model else "the first model it lists"
        about = f"Answers come from the upstream at {settings.upstream_url} ({asked})."
    elif model == EMBEDDED_MODEL:
        about = (f"Answers come from {model}, the embedded demo model: Gemma 3 270M, a small "
                 "offline base model running on this device. Its answers are rough and "
                 "often wrong.")
    elif model and model.startswith("builtin:"):
        about = (f"Answers come from {model}, a built-in test model with random weights: "
                 "its text is meaningless.")
    else:
        about = f"Answers come from {model}, running on this device."
    return f"{about} {HOW_TO_CHANGE}"
