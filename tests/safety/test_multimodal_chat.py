"""A MultimodalChat shared between threads: serialized calls, one open stream, close() mid-stream."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from build_tools.fixtures import fixture_path
from llama_cpp._errors import BusyError, ClosedError
from llama_cpp.mtmd_chat import MultimodalChat

MESSAGES = [[{"role": "user", "content": f"say something about number {i}"}] for i in range(4)]


def answer(chat: MultimodalChat, i: int) -> str:
    out = chat.create_chat_completion(MESSAGES[i % 4], max_tokens=8, temperature=0)
    return out["choices"][0]["message"]["content"]


def test_threads_streams_and_close() -> None:
    chat = MultimodalChat(fixture_path("llama_spm"), fixture_path("mmproj_vision"), n_ctx=256, n_batch=64,
                          n_threads=1)
    try:
        expected = [answer(chat, i) for i in range(8)]
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda i: answer(chat, i), range(8))) == expected
        stream = chat.create_chat_completion(MESSAGES[0], max_tokens=8, temperature=0, stream=True)
        next(stream)
        with pytest.raises(BusyError):
            answer(chat, 1)
        with pytest.raises(BusyError):
            chat.generate_tokens(MESSAGES[1], max_tokens=2)
    finally:
        chat.close()
    with pytest.raises(ClosedError):
        next(stream)
