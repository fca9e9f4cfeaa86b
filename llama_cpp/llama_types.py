"""OpenAI-style result types returned by :class:`~llama_cpp.Llama` (the shapes llama-cpp-python returns)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict, Union


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class Embedding(TypedDict):
    index: int
    object: str
    embedding: list[float] | list[list[float]]


class CreateEmbeddingResponse(TypedDict):
    object: Literal["list"]
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class CompletionLogprobs(TypedDict):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CreateCompletionResponse(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage  # may be absent


CreateCompletionStreamResponse = CreateCompletionResponse
Completion = CreateCompletionResponse
CompletionChunk = CreateCompletionResponse


class ChatCompletionFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionMessageToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ChatCompletionFunctionCall


class ChatCompletionRequestMessage(TypedDict, total=False):
    role: str
    content: str | list[dict[str, Any]] | None
    name: str
    tool_calls: list[ChatCompletionMessageToolCall]
    tool_call_id: str


class ChatCompletionResponseMessage(TypedDict):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ChatCompletionMessageToolCall]  # may be absent


class ChatCompletionLogprobToken(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatCompletionTopLogprobToken(ChatCompletionLogprobToken):
    top_logprobs: list[ChatCompletionLogprobToken]


class ChatCompletionLogprobs(TypedDict):
    content: list[ChatCompletionTopLogprobToken] | None
    refusal: list[ChatCompletionTopLogprobToken] | None


class ChatCompletionResponseChoice(TypedDict):
    index: int
    message: ChatCompletionResponseMessage
    logprobs: ChatCompletionLogprobs | None
    finish_reason: str | None


class CreateChatCompletionResponse(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: CompletionUsage


class ChatCompletionStreamResponseDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[dict[str, Any]]


class ChatCompletionStreamResponseChoice(TypedDict):
    index: int
    delta: ChatCompletionStreamResponseDelta
    finish_reason: str | None
    logprobs: ChatCompletionLogprobs | None  # may be absent


class CreateChatCompletionStreamResponse(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatCompletionStreamResponseChoice]


class ChatCompletionToolFunction(TypedDict, total=False):
    name: str
    description: str
    parameters: dict[str, Any]


class ChatCompletionTool(TypedDict):
    type: Literal["function"]
    function: ChatCompletionToolFunction


class ChatCompletionNamedToolChoice(TypedDict):
    type: Literal["function"]
    function: dict[str, str]


ChatCompletionToolChoiceOption = Union[Literal["none", "auto", "required"], ChatCompletionNamedToolChoice]  # noqa: UP007 (evaluated at run time on 3.10)


class ChatCompletionRequestResponseFormat(TypedDict, total=False):
    type: Literal["text", "json_object", "json_schema"]
    schema: dict[str, Any]
    json_schema: dict[str, Any]
