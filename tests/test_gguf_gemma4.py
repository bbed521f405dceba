"""GGUF `gemma4` files made by llama.cpp's own converter from a tiny transformers Gemma 4 checkpoint
(shared-KV layers, K = V full layers with their own head size, proportional rope, per-layer inputs, layer
scalars, double-wide shared MLPs), loaded by blazr and checked against transformers on the original and
against llama.cpp on the file:
- F32: the detected config is the safetensors one (but the context limit) — the proportional rope read back
  from `rope_freqs`, K = V from the missing `attn_v`; logits within 1e-4 of the logit scale, greedy tokens
  identical;
- Q8_0 (llama.cpp's quantizer): the linear layers stay Q8_0 as stored; llama.cpp itself on that file agrees
  with blazr as closely as it agrees with the file's float values;
- the MoE variant the same way (its experts stacked Q8_0 as stored);
- the file's vocabulary (`tokenizer.ggml.model` gemma4: SentencePiece-style BPE over merges, byte fallback)
  encodes as llama.cpp does.

Gemma 4's converter reads a tokenizer.json with byte fallback (LlamaHfVocab): a small SentencePiece BPE model
trained here (tests.llama_cpp_convert.spm_tokenizer), as transformers' GemmaTokenizer writes it (which adds
<bos>, <eos>, <pad>, <mask>: the checkpoint's vocabulary is that tokenizer's length). llama.cpp takes the
shared layers' sources to be the last two unshared layers (sliding, then full), as in the published models:
the fixture's layer types are laid out so (where transformers' rule — the last unshared layer of each type —
picks the same layers).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from blazr import LLM
from blazr.detect import inspect_checkpoint
from blazr.kernels import q8_packed
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.qlinear import QuantizedLinear
from tests.hf_parity import check_greedy, check_logits
from tests.llama_cpp_convert import convert, quantize, spm_tokenizer
from tests.ssm_fixtures import single_thread
from tests.test_gguf_dense import _check_llama_cpp
from tests.test_hf_gemma4 import MOE, SIZES, randomise_gemma4
from tests.tiny import build

TEXTS = [
    "hello world abc",
    "  two  spaces\n\nand newlines\n",
    "qwerty zzz é ü 😀 ß 字",
    "<bos> written in text",
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@dataclasses.dataclass
class Made:
    hf: torch.nn.Module
    root: Path
    f32: Path
    q8_0: Path


@pytest.fixture(scope="module", params=["dense", "moe"])
def made(request, tmp_path_factory) -> Made:
    """The dense fixture, and the MoE variant (every layer's MLP beside a MoE: the router, its scales and
    the stacked experts under llama.cpp's names)."""
    import transformers

    root = tmp_path_factory.mktemp(f"gemma4_{request.param}")
    tok = transformers.GemmaTokenizer.from_pretrained(spm_tokenizer(root / "spm", 600))
    tok.save_pretrained(root / "tok")
    vocab = len(tok)
    # weights 3x the parity tests' (logits std ~2.4, not ~0.8): llama.cpp's own float forward lies ~1e-2 from
    # transformers' (its float16 KV cache and GELU table), enough to flip near-ties of flatter logits
    sizes = dict(SIZES, vocab_size=vocab, vocab_size_per_layer_input=vocab, initializer_range=0.3)
    if request.param == "moe":
        sizes |= MOE
    hf = build("Gemma4ForCausalLM", root / "hf", **sizes)
    randomise_gemma4(hf, 1)
    hf.save_pretrained(root / "hf")
    f32 = convert(root / "hf", root / "tok", root / "f32.gguf", "f32")
    return Made(hf, root, f32, quantize(f32, root / "q8_0.gguf", "Q8_0"))


def _llm(path: Path, **kw) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


def test_f32_gguf_matches_transformers(made):
    llm = _llm(made.f32)
    assert llm.checkpoint.gguf.metadata["general.architecture"] == "gemma4"
    want = inspect_checkpoint(made.root / "hf").config
    assert dataclasses.replace(llm.config, max_position_embeddings=0) == dataclasses.replace(
        want, max_position_embeddings=0
    )
    check_logits(made.hf, llm)
    check_greedy(made.hf, llm, n=16)


def test_q8_0_gguf_stays_quantized_and_agrees_with_llama_cpp(made):
    ours, dequantized = _llm(made.q8_0), _llm(made.q8_0, quantize="none")
    first = ours.model.layers[0]
    assert any(isinstance(q, QuantizedLinear) and q.kind == q8_packed.runs_as() for q in first.modules())
    if first.moe is not None:  # the stacked experts too
        assert first.moe.experts.w_up is not None and first.moe.experts.w_up.kind == "q8_0g"
    # the per-layer table as the file stores it (llama.cpp's quantizer keeps it F16), the layers' gates Q8_0
    # as stored, the per-layer projection (kept F32 by the quantizer) on the f32 kernel
    per_layer = ours.model.per_layer_inputs
    assert isinstance(per_layer.embed, QuantizedEmbedding) and per_layer.embed.table.kind == "f16"
    assert first.per_layer.gate.kind == q8_packed.runs_as() and isinstance(per_layer.proj, QuantizedLinear)
    _check_llama_cpp(made.q8_0, ours, dequantized, vocab=ours.config.vocab_size)


def test_vocabulary_encodes_as_llama_cpp(made):
    from llama_cpp import Llama

    ref = Llama(str(made.f32), vocab_only=True, verbose=False)
    tok = _llm(made.f32).tokenizer
    for text in TEXTS:
        assert tok.encode(text) == ref.tokenize(text.encode(), add_bos=True, special=True), text
        assert tok.encode_ordinary(text) == ref.tokenize(text.encode(), add_bos=False, special=False), text
        assert tok.decode(tok.encode_ordinary(text)) == text
