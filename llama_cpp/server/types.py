"""Request bodies (pydantic): upstream's fields and defaults, with their ranges checked here.

Unknown fields are ignored (OpenAI clients send fields this server has no use for, such as
``user``). Values that need the model (token ids, prompt length, grammars) are checked by the
routes, which know it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class _Sampling(_Body):
    model: str | None = Field(default=None, description="The model (its alias) to use.")
    temperature: float = Field(default=0.8, ge=0.0, le=100.0, description="0 is greedy decoding.")
    top_p: float = Field(default=0.95, ge=0.0, le=1.0)
    min_p: float = Field(default=0.05, ge=0.0, le=1.0)
    typical_p: float = Field(default=1.0, ge=0.0, le=1.0)
    top_k: int = Field(default=40, ge=0)
    stop: str | list[str] | None = Field(default=None, description="Strings that end the generation.")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    repeat_penalty: float = Field(default=1.1, ge=0.0)
    logit_bias: dict[str, float] | None = None
    logit_bias_type: Literal["input_ids", "tokens"] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, description="Choices to generate.")
    min_tokens: int = Field(default=0, ge=0, le=0, description="Not supported: only 0.")
    mirostat_mode: int = Field(default=0, ge=0, le=2)
    mirostat_tau: float = Field(default=5.0, ge=0.0, le=10.0)
    mirostat_eta: float = Field(default=0.1, ge=0.001, le=1.0)
    grammar: str | None = Field(default=None, description="A GBNF grammar the output must follow.")
    lora: Any = Field(default=None, description='LoRA adapter scales for this request, [{"id": N, "scale": s}] '
                      "(llama-server's; adapters not named: 0; absent: the global scales of /lora-adapters).")
    user: str | None = None


class CreateCompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(default="", description="Text or token ids.")
    suffix: str | None = None
    max_tokens: int | None = Field(default=16, ge=0, description="0 or null: until the context is full.")
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    best_of: int | None = Field(default=1, ge=1, le=1, description="Only 1.")


class CreateChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(default=[], description="The conversation.")
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=0, description="null: until the context is full.")
    max_completion_tokens: int | None = Field(default=None, ge=0, description="OpenAI's newer max_tokens.")
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = Field(default=None, description="Passed to templates that read it.")
    # llama-server's chat-layer fields (the model's settings give their defaults)
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="Extra template variables, "
                                                        'e.g. {"enable_thinking": false}.')
    reasoning_format: str | None = Field(default=None, description="auto, none, deepseek or deepseek-legacy.")
    reasoning_budget_tokens: int | None = Field(
        default=None, ge=-1, validation_alias=AliasChoices("reasoning_budget_tokens", "thinking_budget_tokens"),
        description="Thinking tokens before the end tag is forced (-1 unlimited, 0 no thinking).")
    reasoning_budget_message: str | None = Field(default=None, description="Text put before the forced end tag.")


class CreateResponseRequest(_Body):
    """OpenAI's Responses API (``/v1/responses``); ``store`` and ``previous_response_id`` as OpenAI's, the
    responses kept in memory and bounded (``responses_store*`` settings)."""

    model: str | None = None
    input: str | list[Any] = Field(description="Text, or items: messages, function_call, function_call_output.")
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    seed: int | None = None
    user: str | None = None
    lora: Any = None  # llama-server's per-request LoRA scales, [{"id": N, "scale": s}]


class CountMessageTokensRequest(_Body):
    """Anthropic's ``/v1/messages/count_tokens``."""

    model: str | None = None
    messages: list[Any] = Field(description="user/assistant messages: text or content blocks.")
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # llama-server passes it through too


class CreateMessageRequest(CountMessageTokensRequest):
    """Anthropic's Messages API (``/v1/messages``)."""

    max_tokens: int = Field(ge=1, description="The most tokens to generate.")
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    lora: Any = None  # llama-server's per-request LoRA scales, [{"id": N, "scale": s}]


class CreateEmbeddingRequest(_Body):
    model: str | None = None
    input: (str | list[str] | list[int] | list[list[int]] | dict[str, Any]
            | list[str | list[int] | dict[str, Any]]) = Field(
        description="Text(s) or token ids to embed; on a model with a projector also objects with media: "
        '{"prompt_string", "multimodal_data"} or {"content": [text, image_url and input_audio parts]}.')
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, description="Keep the first dimensions (L2-normalised).")
    user: str | None = None


class RerankRequest(_Body):
    """``/v1/rerank`` (Jina's and Cohere's shape, as llama-server takes it)."""

    model: str | None = None
    query: str
    documents: list[Any] = Field(description="Strings, or objects with a text.")
    top_n: int | None = Field(default=None, description="How many results, best first (default: all).")
    return_documents: bool = False


class TokenizeInputRequest(_Body):
    model: str | None = None
    input: str = Field(description="The text to tokenize.")


class TokenizeInputResponse(BaseModel):
    tokens: list[int]


class TokenizeInputCountResponse(BaseModel):
    count: int


class DetokenizeInputRequest(_Body):
    model: str | None = None
    tokens: list[int] = Field(description="Token ids to turn back into text.")


class DetokenizeInputResponse(BaseModel):
    text: str


class ModelData(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "me"
    permissions: list[str] = []
    speculative: dict[str, Any] | None = None  # types, engine (slots or serial) and why serial; absent when none


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelData]


__all__ = ["CountMessageTokensRequest", "CreateChatCompletionRequest", "CreateMessageRequest", "CreateCompletionRequest", "CreateEmbeddingRequest", "CreateResponseRequest",
           "DetokenizeInputRequest", "DetokenizeInputResponse", "ModelData", "ModelList", "RerankRequest", "TokenizeInputCountResponse",
           "TokenizeInputRequest", "TokenizeInputResponse"]
