"""The speculative options of ``python -m llama_cpp complete|chat`` (llama.cpp's names): the same
text as without them, statistics on request, and clear errors for a bad combination."""

from __future__ import annotations

import pytest

from build_tools.fixtures import fixture_path

from ..runtime.test_cli import cli

BASE = ("-n", 24, "--temp", 0, "-t", 1, "-q", "--ctx", 512)
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def echo_path():
    return fixture_path("qwen35_mtp", form="echo")


@pytest.fixture(scope="module")
def plain_text(echo_path):
    p = cli("complete", echo_path, PROMPT, *BASE)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("opts", [
    ("-md", "draft_model"),
    ("--spec-type", "draft-dflash", "-md", "dflash_draft", "--spec-draft-n-max", 4),
    ("--spec-type", "ngram-simple,draft-simple", "-md", "draft_model", "--spec-draft-n-max", 2),
    ("--spec-type", "ngram-mod"),
])
def test_complete_speculating_prints_the_plain_text(echo_path, plain_text, opts):
    kind = {"draft_model": fixture_path("draft_model", form="echo"),
            "dflash_draft": fixture_path("dflash_draft", form="first")}
    args = [kind.get(o, o) if isinstance(o, str) else o for o in opts]
    p = cli("complete", echo_path, PROMPT, *BASE, *args, "--stats")
    assert p.returncode == 0, p.stderr
    assert p.stdout == plain_text
    assert "drafted" in p.stderr and "generated 24 tokens" in p.stderr, p.stderr


def test_chat_speculating_prints_the_plain_reply(echo_path):
    base = ("chat", echo_path, "-m", "hello", "-n", 12, "--temp", 0, "-t", 1, "-q", "--chat-format", "chatml")
    plain = cli(*base)
    assert plain.returncode == 0, plain.stderr
    spec = cli(*base, "-md", fixture_path("draft_model", form="echo"), "--spec-draft-n-max", 3, "--stats")
    assert spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout and "accepted" in spec.stderr


@pytest.mark.parametrize(("opts", "message"), [
    (("--spec-draft-n-max", 4), "--spec-draft-n-max needs --spec-type"),
    (("-md", "missing-draft.gguf"), "draft model not found: missing-draft.gguf"),
    (("--spec-type", "draft-bogus"), "draft-bogus"),
    (("--spec-type", "ngram-simple", "--spec-draft-n-max", 0), "draft_n_max=0 is out of range"),
])
def test_bad_options_are_reported_before_loading(echo_path, opts, message):
    p = cli("complete", echo_path, PROMPT, *BASE, *opts)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr and "Traceback" not in p.stderr
