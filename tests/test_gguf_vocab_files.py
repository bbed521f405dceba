"""The GGUF tokenizer path on real vocabularies: llama.cpp's own vocabulary files (`models/ggml-vocab-*.gguf`
of the llama-cpp-python sdist `make test` unpacks, vocabulary only) with their test inputs (`.inp`:
multilingual text, emoji, whitespace runs, code) and the ids the model's HF tokenizer gives them (`.out`,
written by llama.cpp's convert_hf_to_gguf_update.py with transformers' AutoTokenizer, without BOS): blazr's
tokenizer built from each file's metadata — its `tokenizer.ggml.pre` regexes, or SentencePiece — gives the
same ids (after the BOS it prepends where the file says to)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazr.loading.gguf import GGUFFile
from blazr.tokenizer import TokenizerSource, load_tokenizer
from tests.llama_cpp_convert import converter

# file → its tokenizer.ggml.pre ("default" on the SentencePiece vocabulary, which has no pre-tokenizer)
FILES = {
    "qwen2": "qwen2",
    "qwen35": "qwen35",
    "llama-bpe": "llama-bpe",
    "gpt-2": "gpt-2",
    "starcoder": "starcoder",
    "refact": "refact",
    "mpt": "mpt",
    "llama-spm": "default",
}


def _vocab_file(name: str) -> Path:
    return converter().parent / "models" / f"ggml-vocab-{name}.gguf"


@pytest.mark.parametrize("name", list(FILES))
def test_gguf_vocabulary_ids_equal_hf_tokenizer(name: str) -> None:
    path = _vocab_file(name)
    meta = GGUFFile(path).metadata
    assert meta.get("tokenizer.ggml.pre") == FILES[name]
    tok = load_tokenizer(TokenizerSource(gguf_metadata=meta))
    bos = [tok.bos_token_id] if tok.add_bos and tok.bos_token_id is not None else []
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    wants = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    assert len(texts) >= 40
    for sample in ("🦙", "нещо", "我想在", "```", "Việt"):  # emoji, Cyrillic, Chinese, code, Vietnamese
        assert any(sample in t for t in texts), sample
    for text, want in zip(texts, wants, strict=True):
        assert tok.encode(text) == bos + [int(i) for i in want.split()], text
