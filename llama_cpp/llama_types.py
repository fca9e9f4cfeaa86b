"""OpenAI-style request and result types of :class:`~llama_cpp.Llama`: every name
llama-cpp-python 0.3.36's ``llama_types`` has, with the shapes it returns and accepts.

``ChatCompletionRequestMessage`` is one ``TypedDict`` covering every role (upstream: a ``Union``
of the per-role types, which are here too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, TypedDict, Union  # noqa: UP035 (run-time aliases on 3.10)

if TYPE_CHECKING:  # annotations stay strings at run time (3.10 has no typing.NotRequired)
    from typing_extensions import NotRequired

JsonType = Union[None, int, str, bool, List[Any], Dict[str, Any]]  # noqa: UP006, UP007


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


# --- the rest of upstream's request and response names ----------------------------------------

ChatCompletionResponseFunctionCall = ChatCompletionFunctionCall


class ChatCompletionFunction(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: Dict[str, JsonType]  # noqa: UP006


class ChatCompletionMessageToolCallChunkFunction(TypedDict):
    name: Optional[str]  # noqa: UP045
    arguments: str


class ChatCompletionMessageToolCallChunk(TypedDict):
    index: int
    id: NotRequired[str]
    type: Literal["function"]
    function: ChatCompletionMessageToolCallChunkFunction


class ChatCompletionStreamResponseDeltaEmpty(TypedDict):
    pass


class ChatCompletionStreamResponseDeltaFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionFunctions(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: Dict[str, JsonType]  # noqa: UP006


class ChatCompletionFunctionCallOption(TypedDict):
    name: str


class ChatCompletionRequestMessageContentPartText(TypedDict):
    type: Literal["text"]
    text: str


class ChatCompletionRequestMessageContentPartImageImageUrl(TypedDict):
    url: str
    detail: NotRequired[Literal["auto", "low", "high"]]


class ChatCompletionRequestMessageContentPartImage(TypedDict):
    type: Literal["image_url"]
    image_url: Union[str, ChatCompletionRequestMessageContentPartImageImageUrl]  # noqa: UP007


ChatCompletionRequestMessageContentPart = Union[  # noqa: UP007
    ChatCompletionRequestMessageContentPartText, ChatCompletionRequestMessageContentPartImage]


class ChatCompletionRequestSystemMessage(TypedDict):
    role: Literal["system"]
    content: Optional[str]  # noqa: UP045


class ChatCompletionRequestUserMessage(TypedDict):
    role: Literal["user"]
    content: Optional[Union[str, List[ChatCompletionRequestMessageContentPart]]]  # noqa: UP006, UP007, UP045


class ChatCompletionMessageToolCallFunction(TypedDict):
    name: str
    arguments: str


ChatCompletionMessageToolCalls = List[ChatCompletionMessageToolCall]  # noqa: UP006


class ChatCompletionRequestAssistantMessageFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionRequestAssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: NotRequired[Optional[str]]  # noqa: UP045
    tool_calls: NotRequired[ChatCompletionMessageToolCalls]
    function_call: NotRequired[ChatCompletionRequestAssistantMessageFunctionCall]


class ChatCompletionRequestToolMessage(TypedDict):
    role: Literal["tool"]
    content: Optional[str]  # noqa: UP045
    tool_call_id: str


class ChatCompletionRequestFunctionMessage(TypedDict):
    role: Literal["function"]
    content: Optional[str]  # noqa: UP045
    name: str


class ChatCompletionRequestFunctionCallOption(TypedDict):
    name: str


ChatCompletionRequestFunctionCall = Union[Literal["none", "auto"], ChatCompletionRequestFunctionCallOption]  # noqa: UP007
ChatCompletionFunctionParameters = Dict[str, JsonType]  # noqa: UP006


class ChatCompletionNamedToolChoiceFunction(TypedDict):
    name: str


EmbeddingData = Embedding
ChatCompletionMessage = ChatCompletionResponseMessage
ChatCompletionChoice = ChatCompletionResponseChoice
ChatCompletion = CreateChatCompletionResponse
ChatCompletionChunkDeltaEmpty = ChatCompletionStreamResponseDeltaEmpty
ChatCompletionChunkChoice = ChatCompletionStreamResponseChoice
ChatCompletionChunkDelta = ChatCompletionStreamResponseDelta
ChatCompletionChunk = CreateChatCompletionStreamResponse
ChatCompletionStreamResponse = CreateChatCompletionStreamResponse
ChatCompletionResponseFunction = ChatCompletionFunction

__all__ = ["ChatCompletion", "ChatCompletionChoice", "ChatCompletionChunk", "ChatCompletionChunkChoice",
    "ChatCompletionChunkDelta", "ChatCompletionChunkDeltaEmpty", "ChatCompletionFunction",
    "ChatCompletionFunctionCall", "ChatCompletionFunctionCallOption", "ChatCompletionFunctionParameters",
    "ChatCompletionFunctions", "ChatCompletionLogprobToken", "ChatCompletionLogprobs", "ChatCompletionMessage",
    "ChatCompletionMessageToolCall", "ChatCompletionMessageToolCallChunk",
    "ChatCompletionMessageToolCallChunkFunction", "ChatCompletionMessageToolCallFunction",
    "ChatCompletionMessageToolCalls", "ChatCompletionNamedToolChoice", "ChatCompletionNamedToolChoiceFunction",
    "ChatCompletionRequestAssistantMessage", "ChatCompletionRequestAssistantMessageFunctionCall",
    "ChatCompletionRequestFunctionCall", "ChatCompletionRequestFunctionCallOption",
    "ChatCompletionRequestFunctionMessage", "ChatCompletionRequestMessage",
    "ChatCompletionRequestMessageContentPart", "ChatCompletionRequestMessageContentPartImage",
    "ChatCompletionRequestMessageContentPartImageImageUrl", "ChatCompletionRequestMessageContentPartText",
    "ChatCompletionRequestResponseFormat", "ChatCompletionRequestSystemMessage", "ChatCompletionRequestToolMessage",
    "ChatCompletionRequestUserMessage", "ChatCompletionResponseChoice", "ChatCompletionResponseFunction",
    "ChatCompletionResponseFunctionCall", "ChatCompletionResponseMessage", "ChatCompletionStreamResponse",
    "ChatCompletionStreamResponseChoice", "ChatCompletionStreamResponseDelta",
    "ChatCompletionStreamResponseDeltaEmpty", "ChatCompletionStreamResponseDeltaFunctionCall", "ChatCompletionTool",
    "ChatCompletionToolChoiceOption", "ChatCompletionToolFunction", "ChatCompletionTopLogprobToken", "Completion",
    "CompletionChoice", "CompletionChunk", "CompletionLogprobs", "CompletionUsage", "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse", "CreateCompletionResponse", "CreateCompletionStreamResponse",
    "CreateEmbeddingResponse", "Embedding", "EmbeddingData", "EmbeddingUsage", "JsonType"]
