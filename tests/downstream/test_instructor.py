"""instructor on ``Llama.create_chat_completion_openai_v1`` in JSON-schema mode, as its llama-cpp-python docs show."""

from __future__ import annotations

import pytest

instructor = pytest.importorskip("instructor")

from pydantic import BaseModel  # noqa: E402

from llama_cpp import Llama  # noqa: E402


class UserDetail(BaseModel):
    name: str
    adult: bool


def test_response_model(gemma_path, record):
    llm = Llama(model_path=gemma_path, n_ctx=2048, chat_format="gemma", verbose=False)
    try:
        create = instructor.patch(create=llm.create_chat_completion_openai_v1, mode=instructor.Mode.JSON_SCHEMA)
        user = create(messages=[{"role": "user", "content": "Extract: Jason is 30 years old, an adult."}],
                      response_model=UserDetail, max_tokens=200, temperature=0.0)
    finally:
        llm.close()
    assert isinstance(user, UserDetail)
    record("user", user.model_dump())
