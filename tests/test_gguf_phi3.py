"""GGUF `phi3` files (Phi-3 / Phi-4) made by llama.cpp's own converter from tiny transformers checkpoints,
loaded by blazr and checked against transformers on the original (as test_gguf_dense.py does for the other
dense families):
- F32: the detected config is the safetensors one (but the context limit) — LongRoPE's factors read from
  the file's `rope_factors_short` / `rope_factors_long` tensors —; logits within 1e-4 of the logit scale,
  greedy tokens identical;
- Q8_0 (llama.cpp's quantizer): the linear layers, fused qkv and gate | up included, stay Q8_0 as stored;
  llama.cpp itself on that file agrees with blazr as closely as it agrees with the file's float values.

Variants: a Phi-3-mini-4k shape (its converter's SentencePiece `llama` vocabulary: a small tokenizer.model
trained here; all heads; a 24-token sliding window) and a Phi-4-mini shape (a GPT-2 BPE vocabulary —
SmolLM2's, under `tokenizer_class` GPT2Tokenizer as Phi-4 publishes it —; GQA, partial rope 0.75, LongRoPE
with an original context of 4 tokens, tied embeddings). Both blazr (a 256-token limit) and llama.cpp
(`n_ctx` 128) are past that original context, so both rotate with the long factors, as transformers does on
prompts longer than 4 tokens. llama.cpp runs Phi without its sliding window: it is compared over prompts
within the window (blazr keeps the window, as transformers: the F32 check covers prompts past it).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from blazr import LLM
from blazr.config import AttentionConfig, ModelConfig
from blazr.detect import inspect_checkpoint
from blazr.kernels import q8_packed
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits
from tests.hf_parity import check_greedy, check_logits, prompts
from tests.llama_cpp_convert import VOCAB, convert, export_tokenizer, quantize, spm_tokenizer
from tests.ssm_fixtures import randomise, single_thread
from tests.test_hf_phi3 import SIZES, longrope
from tests.tiny import build

SPM_VOCAB = 600
WINDOW = 24
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "phi3-mini": (
        "Phi3ForCausalLM",
        dict(SIZES, vocab_size=SPM_VOCAB, num_key_value_heads=4, sliding_window=WINDOW),
    ),
    "phi4-mini": (
        "Phi3ForCausalLM",
        dict(SIZES, vocab_size=VOCAB, num_key_value_heads=2, tie_word_embeddings=True, **longrope(4)),
    ),
}


@dataclasses.dataclass
class Made:
    hf: torch.nn.Module
    config: ModelConfig  # detected from the safetensors checkpoint
    f32: Path
    q8_0: Path


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


def _tokenizer(name: str, root: Path) -> Path:
    """Phi-3's SentencePiece model, or Phi-4's GPT-2 BPE (SmolLM2's files, its class named GPT2Tokenizer:
    what sends the converter to its BPE path)."""
    if name == "phi3-mini":
        return spm_tokenizer(root / "tok", SPM_VOCAB)
    tok = root / "tok"
    shutil.copytree(export_tokenizer(root / "smollm2"), tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    return tok


def _build(name: str, root: Path) -> tuple[torch.nn.Module, Path]:
    """The checkpoint (built in the main thread: transformers' lazy imports are not thread-safe) and its
    tokenizer."""
    arch, overrides = VARIANTS[name]
    hf = build(arch, root / "hf", **overrides)
    randomise(hf, 1)
    hf.save_pretrained(root / "hf")
    return hf, _tokenizer(name, root)


def _convert(root: Path, tok: Path) -> tuple[Path, Path]:
    f32 = convert(root / "hf", tok, root / "f32.gguf", "f32")
    return f32, quantize(f32, root / "q8_0.gguf", "Q8_0")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Made]:
    """Both variants built, then converted two at a time (a converter process each)."""
    roots = {name: tmp_path_factory.mktemp(name) for name in VARIANTS}
    built = {name: _build(name, root) for name, root in roots.items()}
    with ThreadPoolExecutor(2) as pool:
        files = {name: pool.submit(_convert, roots[name], built[name][1]) for name in VARIANTS}
        return {
            name: Made(built[name][0], inspect_checkpoint(roots[name] / "hf").config, *files[name].result())
            for name in VARIANTS
        }


def _llm(path: Path, **kw: Any) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_f32_gguf_matches_transformers(made, name):
    m = made[name]
    llm = _llm(m.f32)
    meta = llm.checkpoint.gguf.metadata
    assert meta["general.architecture"] == "phi3"
    assert meta["tokenizer.ggml.model"] == ("llama" if name == "phi3-mini" else "gpt2")
    assert ("rope_factors_long.weight" in llm.checkpoint.gguf.tensor_names) == (name == "phi4-mini")
    assert dataclasses.replace(llm.config, max_position_embeddings=0) == dataclasses.replace(
        m.config, max_position_embeddings=0
    )
    rope = llm.config.layers[0].mixer(AttentionConfig).rope
    assert rope.scaling == ("longrope" if name == "phi4-mini" else "default")
    check_logits(m.hf, llm)
    check_greedy(m.hf, llm, n=16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_q8_0_gguf_stays_quantized_and_agrees_with_llama_cpp(made, name):
    m = made[name]
    ours, dequantized = _llm(m.q8_0), _llm(m.q8_0, quantize="none")
    first = ours.model.layers[0]
    linears = {n: q for n, q in first.named_modules() if isinstance(q, QuantizedLinear)}
    assert {n: q.kind for n, q in linears.items() if n.endswith(("qkv_proj", "gate_up_proj"))} == {
        "attn.qkv_proj": q8_packed.runs_as(),
        "mlp.gate_up_proj": q8_packed.runs_as(),
    }
    assert not any(q.kind == "f32" for q in linears.values())
    _check_llama_cpp(m.q8_0, ours, dequantized, length=WINDOW if name == "phi3-mini" else 40)


def _check_llama_cpp(path: Path, ours: LLM, dequantized: LLM, length: int) -> None:
    """llama.cpp on the same file: blazr is as close to it as it is to the file's float values
    (test_gguf_dense's check, over a prompt of `length` tokens)."""
    from llama_cpp import Llama

    ids = prompts([length], seed=6, vocab=ours.config.vocab_size)[0]
    ref = Llama(str(path), logits_all=True, n_ctx=128, n_batch=128, n_threads=1, verbose=False)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[: len(ids)]))
    got = full_logits(ours.runner, [ids])[0]
    exact = full_logits(dequantized.runner, [ids])[0]
    assert (got - theirs).abs().mean() <= 1.5 * (theirs - exact).abs().mean() + 1e-3
    assert (got.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9
