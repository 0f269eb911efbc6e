"""The request bodies of the upstream's API as typed pydantic models: what a body may hold
is declared once, checked before anything else reads it, and published (GET /openapi.json).

Numbers are JSON numbers only (a string "5" or a boolean is refused, as the OpenAI API
refuses them); an integer field takes 5.0 but not 5.5. Unknown and unsupported fields are
refused by name before these models see the body (wire.parse_chat_request)."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr

# The widest integer any field means anything at (torch seeds are 64-bit).
INT_RANGE = (-(2**63), 2**64 - 1)


def _real(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError("out of range") from None


def _integral(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("not a number")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("not an integer")
    if not INT_RANGE[0] <= value <= INT_RANGE[1]:
        raise ValueError("out of range")
    return int(value)


Real = Annotated[float, BeforeValidator(_real)]
Integer = Annotated[int, BeforeValidator(_integral)]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. a name: it changes nothing here
    role: Literal["system", "user", "assistant"]
    content: StrictStr | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool | None = None
    include_obfuscation: Literal[False] | None = None


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions: OpenAI's fields this server honours or accepts as labels,
    and its repetition-guard extensions (send them with the SDK's ``extra_body``)."""

    model_config = ConfigDict(extra="forbid")
    messages: list[ChatMessage] = Field(min_length=1)
    model: StrictStr | None = Field(None, max_length=128)
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Integer | None = None
    max_completion_tokens: Integer | None = None
    temperature: Real | None = None
    top_p: Real | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: Integer | None = None
    frequency_penalty: Real | None = None
    presence_penalty: Real | None = None
    repetition_penalty: Real | None = None
    repetition_window: Integer | None = None
    stop_on_loops: StrictBool | None = None
    dry_multiplier: Real | None = None
    dry_base: Real | None = None
    dry_allowed_length: Integer | None = None
    user: StrictStr | None = Field(None, max_length=256)
    safety_identifier: StrictStr | None = Field(None, max_length=256)
    prompt_cache_key: StrictStr | None = Field(None, max_length=256)
    metadata: dict[StrictStr, StrictStr] | None = None


class SchemaUpload(BaseModel):
    """POST /v1/schemas as JSON (the PML itself may be sent as application/pml+xml)."""

    model_config = ConfigDict(extra="forbid")
    pml: StrictStr = Field(alias="schema")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: every 4xx and 5xx answer."""

    error: ErrorDetail
