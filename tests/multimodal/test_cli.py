"""``python -m llama_cpp mmchat`` end to end on the fixtures."""

from __future__ import annotations

import json

from llama_cpp.cli import main


def test_mmchat_prompt_and_json(capsys, qwen35_random, mmproj_vision, png_path):
    base = [str(qwen35_random), "--mmproj", str(mmproj_vision), "--image", str(png_path), "-p", "describe",
            "-n", "8", "--temp", "0", "-t", "1", "-c", "512", "-b", "64"]
    assert main(["mmchat", *base]) == 0
    plain = capsys.readouterr().out.strip()
    assert plain
    assert main(["mmchat", *base, "--mtp", "3", "--stats"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == plain
    assert "drafted" in out.err
    # the n-gram types speculate in multimodal chat too (llama.cpp's --spec-type names)
    assert main(["mmchat", *base, "--spec-type", "ngram-simple,ngram-mod", "--spec-draft-n-max", "4", "--stats"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == plain and "drafted" in out.err
    assert main(["mmchat", *base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["choices"][0]["message"]["content"].strip() == plain
    assert doc["usage"]["completion_tokens"] == 8


def test_mmchat_errors(capsys, spm_model, mmproj_vision, tmp_path):
    rc = main(["mmchat", str(spm_model), "--mmproj", str(mmproj_vision), "--image", str(tmp_path / "nope.png"),
               "-p", "x", "-t", "1", "-c", "512"])
    assert rc == 2 and "file not found" in capsys.readouterr().err
    rc = main(["mmchat", str(spm_model), "--mmproj", str(mmproj_vision), "-p", "x", "--mtp", "2", "-t", "1"])
    assert rc == 2 and "NextN" in capsys.readouterr().err
