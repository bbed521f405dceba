"""The test session's converter workers (tests/llama_cpp_convert.py `KEEP_WORKERS`) write the same bytes as
llama.cpp's converter run as a script, report a failed conversion, and convert the next one after it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import llama_cpp_convert
from tests.llama_cpp_convert import convert, export_tokenizer
from tests.tiny import build


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("convert")
    tok = export_tokenizer(root / "tok")
    build("LlamaForCausalLM", root / "hf", vocab_size=llama_cpp_convert.VOCAB).save_pretrained(root / "hf")
    return root, tok


def test_a_worker_writes_what_the_script_writes(checkpoint, monkeypatch):
    root, tok = checkpoint
    assert llama_cpp_convert.KEEP_WORKERS  # the session's setting (tests/conftest.py)
    first, again = convert(root / "hf", tok, root / "a.gguf"), convert(root / "hf", tok, root / "b.gguf")
    monkeypatch.setattr(llama_cpp_convert, "KEEP_WORKERS", False)  # a process of its own, as a user runs it
    script = convert(root / "hf", tok, root / "c.gguf")
    assert first.read_bytes() == script.read_bytes() == again.read_bytes()


def test_a_failed_conversion_is_reported_and_the_next_one_runs(checkpoint):
    root, tok = checkpoint
    bad = root / "unknown"
    shutil.copytree(root / "hf", bad, dirs_exist_ok=True)
    raw = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**raw, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(RuntimeError, match="NoSuchForCausalLM"):
        convert(bad, tok, root / "bad.gguf")
    assert convert(root / "hf", tok, root / "d.gguf").stat().st_size > 0
