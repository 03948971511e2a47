"""The OpenAI wire format as pydantic models: what a request may say, what a response says.

Why this module exists: the HTTP layer should not hand-check fields. Each request body is
validated once against these models, strictly (``"max_tokens": "10"`` and ``"n": true`` are
errors, not guesses), and a failure names the field so the client hears ``param="max_tokens"``.
Fields that no API defines are ignored, as vLLM does; fields OpenAI defines that this engine
cannot honour (a suffix, best_of, ...) are listed in ``UNSUPPORTED`` with the
value that means "off", so sending them switched off is fine and switching them on is a 400.

The response models mirror OpenAI's objects field for field, plus vLLM's extensions
(``stop_reason``; ``token_ids`` and ``prompt_token_ids`` with ``return_token_ids``;
``prompt_logprobs``, per completions choice and once at the top of a chat response), and vLLM's
``/tokenize`` and ``/detokenize`` shapes. A request model may name its own ``unsupported``
fields; the generating endpoints share ``UNSUPPORTED``.
"""

from __future__ import annotations

import time
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


# ---------------------------------------------------------------------------- requests

class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: every chunk carries the usage so far


class _Sampling(_Strict):
    """Sampling fields shared by both endpoints: OpenAI's names plus vLLM's extensions."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what torch.Generator takes
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=8)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    user: str | None = None  # accepted, ignored
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    min_tokens: int = Field(0, ge=0, le=2**31 - 1)
    skip_special_tokens: bool = True
    return_token_ids: bool = False  # vLLM: add token_ids / prompt_token_ids to the response
    # Structured outputs (Day 67): OpenAI's response_format, or vLLM's structured_outputs
    # object ({"json" | "regex" | "choice" | "grammar" | "json_object": ...}); parsing.py reads
    # them into a StructuredOutputsParams.
    response_format: dict | None = None
    structured_outputs: dict | None = None
    # {"token id": bias in [-100, 100]}, added to the logits before sampling (OpenAI's keys are
    # strings); sampling.params checks the ids against the vocabulary
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: int | None = Field(None, ge=-1, le=20)  # vLLM: -1 = the whole vocabulary


class CompletionRequest(_Sampling):
    unsupported: ClassVar[dict[str, tuple]]  # set below UNSUPPORTED
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(None, ge=1)  # None: vLLM's default of 16
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False  # the prompt's text (and, with logprobs, its logprobs) before the output


class TextPart(_Strict):
    type: str
    text: str | None = None


class FunctionCall(_Strict):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(_Strict):
    """One call an assistant made: in a response, and in the history a client sends back."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # null (or absent) only for an assistant
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning: str | None = None  # an assistant's thinking (vLLM's new name) ...
    reasoning_content: str | None = None  # ... and its old one; both are read


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class ToolDefinition(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    unsupported: ClassVar[dict[str, tuple]]  # set below UNSUPPORTED
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True  # vLLM extension
    tools: list[ToolDefinition] | None = None
    # None: "auto" when tools are given, else "none" (OpenAI's rule)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # False: at most one call
    chat_template_kwargs: dict | None = None  # extra variables for the template


# field -> the values that mean "not used"; anything else is a 400 naming the field. One list
# for both endpoints: a client that sends tools to /v1/completions expects them to work too.
_OFF = (None, False, [], {}, "")
UNSUPPORTED: dict[str, tuple] = {
    "functions": _OFF, "function_call": (*_OFF, "none"), "suffix": _OFF,
    "best_of": (*_OFF, 1), "audio": _OFF, "modalities": (*_OFF, ["text"]),
    "prediction": _OFF, "web_search_options": _OFF, "prompt_cache_key": _OFF,
    "cache_salt": _OFF, "guided_json": _OFF, "guided_regex": _OFF, "guided_choice": _OFF,
    "guided_grammar": _OFF,
}
# tools belong to chat: sent to /v1/completions they are a 400 naming the field (vLLM's answer)
CompletionRequest.unsupported = {**UNSUPPORTED, "tools": _OFF,
                                 "tool_choice": (*_OFF, "none"), "parallel_tool_calls": _OFF}
ChatCompletionRequest.unsupported = {**UNSUPPORTED, "echo": _OFF}


def unsupported_field(body: dict, table: dict[str, tuple] = UNSUPPORTED) -> str | None:
    """The first field of ``body`` that asks for something this engine does not do."""
    for name, off in table.items():
        if name in body and not any(body[name] == v and type(body[name]) is type(v)
                                    for v in off):
            return name
    return None


# ---------------------------------------------------------------------------- vLLM's tokenizer API

class TokenizeCompletionRequest(_Strict):
    unsupported: ClassVar[dict[str, tuple]] = {}
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # BOS, where the tokenizer adds one
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Strict):
    unsupported: ClassVar[dict[str, tuple]] = {
        "continue_final_message": _OFF, "chat_template": _OFF, "mm_processor_kwargs": _OFF}
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # on top of what the template writes
    return_token_strs: bool | None = False
    tools: list[ToolDefinition] | None = None  # rendered as /v1/chat/completions renders them
    chat_template_kwargs: dict | None = None  # extra variables for the template


class DetokenizeRequest(_Strict):
    unsupported: ClassVar[dict[str, tuple]] = {}
    model: str | None = None
    tokens: list[int]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


# ---------------------------------------------------------------------------- responses

class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's ``Logprob``: one token's logprob at one prompt position, its rank there (1 = the
    most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's prompt_logprobs: per prompt position, None for the first, else {token id: Logprob} for
# the prompt token and the top k there
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatLogprob] | None = None


class AssistantMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None  # the text inside <think>...</think>, with --reasoning-parser
    reasoning_content: str | None = None  # the same text under vLLM's older name
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM: one list for the one prompt
    prompt_token_ids: list[int] | None = None


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of one call in a stream: the first carries ``id``, ``type`` and the name with
    empty arguments; the rest carry only the ``index`` and a fragment of the arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "nanoserve"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]
