"""Request bodies (pydantic): upstream's fields and defaults, with their ranges checked here.

Unknown fields are ignored (OpenAI clients send fields this server has no use for, such as
``user``). Values that need the model (token ids, prompt length, grammars) are checked by the
routes, which know it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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


class CreateEmbeddingRequest(_Body):
    model: str | None = None
    input: str | list[str] = Field(description="The text(s) to embed.")
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None


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


__all__ = ["CreateChatCompletionRequest", "CreateCompletionRequest", "CreateEmbeddingRequest",
           "DetokenizeInputRequest", "DetokenizeInputResponse", "ModelData", "ModelList", "TokenizeInputCountResponse",
           "TokenizeInputRequest", "TokenizeInputResponse"]
