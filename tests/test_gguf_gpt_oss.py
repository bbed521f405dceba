"""GPT-OSS from GGUF (llama.cpp's `gpt-oss`), files made by llama.cpp's own converter from the tiny
transformers checkpoints of test_hf_gpt_oss.py (sinks, biases, alternating sliding / full layers, YaRN, a
biased router, experts with biases and the clamped SwiGLU):
- F32 (from a float checkpoint): detected as the safetensors model (but the context limit), transformers'
  logits within 1e-4 of the logit scale and its greedy tokens; llama.cpp's logits on the file agree (with
  llama.cpp's truncated YaRN, see test_llama_cpp_agrees);
- MXFP4 (from an MXFP4 checkpoint: the converter repacks the experts' blocks as GGUF type 39, its nibble
  order): the experts dequantized (`--quantize none`) to exactly the checkpoint's values — transformers on
  the dequantized experts is matched as closely —; by default kept as stored (the mxfp4 kernel, 8-bit
  activations as llama.cpp's), and llama.cpp on that file agrees.

The files carry SmolLM2's tokenizer (the converter's `_set_vocab_gpt2` recognises its pre-tokenizer)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from blazr import LLM
from blazr.detect import inspect_checkpoint
from blazr.kernels.quant import dequantize
from tests.drive import full_logits
from tests.hf_parity import check_greedy, check_logits, prompts
from tests.llama_cpp_convert import VOCAB, convert, export_tokenizer
from tests.ssm_fixtures import single_thread
from tests.test_hf_gpt_oss import VARIANTS, build_gpt_oss, check_close_to_dequantized, store_mxfp4_experts

# a window of 8 < the prompts, so llama.cpp's sliding layers are exercised too
SHAPE = dict(VARIANTS["yarn-window"], vocab_size=VOCAB, swiglu_limit=7.0)
SHAPE["layer_types"] = ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@dataclasses.dataclass
class Made:
    hf: torch.nn.Module
    hf_dir: Path
    gguf: Path


@pytest.fixture(scope="module", params=["f32", "mxfp4"])
def made(request, tmp_path_factory) -> Made:
    root = tmp_path_factory.mktemp(request.param)
    tokenizer_dir = export_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    hf = build_gpt_oss(root / "hf", **SHAPE)
    if request.param == "mxfp4":
        store_mxfp4_experts(root / "hf", hf)
    gguf = convert(root / "hf", tokenizer_dir, root / f"{request.param}.gguf", "f32")
    return Made(hf, root / "hf", gguf)


def _llm(path: Path, **kw) -> LLM:
    return LLM(path, cpu=True, dtype="float32", max_num_seqs=2, **kw)


def test_gguf_matches_transformers(made, caplog):
    """The float path (the MXFP4 file's experts dequantized, `--quantize none`) equals transformers."""
    is_mxfp4 = made.gguf.stem == "mxfp4"
    with caplog.at_level(logging.WARNING, logger="blazr"):
        llm = _llm(made.gguf, quantize="none" if is_mxfp4 else "auto")
    assert not [r for r in caplog.records if "ignored" in r.getMessage()], caplog.text
    meta, gguf = llm.checkpoint.gguf.metadata, llm.checkpoint.gguf
    assert meta["general.architecture"] == "gpt-oss"
    assert "blk.0.attn_sinks.weight" in gguf.tensor_names
    assert (gguf.tensor_type("blk.0.ffn_gate_exps.weight") == "MXFP4") == is_mxfp4
    want = inspect_checkpoint(made.hf_dir).config
    assert dataclasses.replace(llm.config, max_position_embeddings=0) == dataclasses.replace(
        want, max_position_embeddings=0
    )
    check_logits(made.hf, llm)
    check_greedy(made.hf, llm, n=16)


def test_mxfp4_experts_run_as_stored(made):
    """By default the MXFP4 experts stay as the file stores them (17 bytes per 32 values, run by the mxfp4
    kernel), holding the dequantized path's values exactly; logits within the 8-bit activation rounding of
    that path's (test_hf_gpt_oss.py `check_close_to_dequantized`). The F32 file's experts stay float."""
    if made.gguf.stem != "mxfp4":
        experts = [layer.moe.experts for layer in _llm(made.gguf).runner.model.layers]
        assert all(e.w_up is None or e.w_up.kind == "f32" for e in experts)
        return
    ours, plain = _llm(made.gguf), _llm(made.gguf, quantize="none")
    for layer, ref in zip(ours.runner.model.layers, plain.runner.model.layers, strict=True):
        experts, want = layer.moe.experts, ref.moe.experts
        assert experts.w_up.kind == experts.w_down.kind == "mxfp4"
        E, N, D = want.gate_up_proj.shape
        assert torch.equal(dequantize(experts.w_up), want.gate_up_proj.reshape(E * N, D))
        assert torch.equal(dequantize(experts.w_down), want.down_proj.reshape(E * D, -1))
        for w in (experts.w_up, experts.w_down):
            assert w.nbytes * 8 == 4.25 * w.out_features * w.in_features
    check_close_to_dequantized(ours, plain)


def test_llama_cpp_agrees(made, monkeypatch):
    """llama.cpp's logits on the file (its KV cache float32: its default f16 cache moves the logits by 1e-3
    and here flips a near-tied routing choice): within 1e-5 of the logit scale on the F32 file, within its
    8-bit activation rounding on the MXFP4 one — once blazr's YaRN
    rounds its correction range to whole dims as llama.cpp's does (`ggml_rope_yarn_corr_dims`), where
    GPT-OSS's config (`truncate: false`, transformers and blazr) does not: that alone moves llama.cpp's
    logits away from transformers' by up to 0.1 here, growing with the position."""
    from llama_cpp import Llama

    import blazr.detect.gguf as detect_gguf

    ids = prompts([40], seed=6, vocab=VOCAB)[0]
    f32 = dict(type_k=0, type_v=0)  # GGML_TYPE_F32
    ref = Llama(str(made.gguf), logits_all=True, n_ctx=128, n_batch=128, n_threads=1, verbose=False, **f32)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[: len(ids)]))
    as_gguf = detect_gguf._CONFIG_KEYS["gpt-oss"]

    def truncated(key, num_layers):
        raw = as_gguf(key, num_layers)
        raw["rope_scaling"]["truncate"] = True
        return raw

    monkeypatch.setitem(detect_gguf._CONFIG_KEYS, "gpt-oss", truncated)
    got = full_logits(_llm(made.gguf).runner, [ids])[0]
    scale = got.abs().max()
    if made.gguf.stem == "f32":
        assert (got - theirs).abs().max() <= 1e-5 * scale
        assert torch.equal(got.argmax(-1), theirs.argmax(-1))
    else:  # llama.cpp's MXFP4 dot products take 8-bit activations (Q8_0 blocks): their rounding only
        assert (got - theirs).abs().max() <= 0.02 * scale and (got - theirs).abs().mean() <= 0.002 * scale
        row_error = (got - theirs).abs().amax(-1)
        margin = got.amax(-1) - got.gather(-1, theirs.argmax(-1, keepdim=True)).squeeze(-1)
        assert (margin <= 2 * row_error).all()  # a different top-1 only at a near-tie
