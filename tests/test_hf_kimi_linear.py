"""Kimi-Linear parity with transformers: Kimi Delta Attention layers (the delta rule with a channel-wise
decay, q / k / v short convs, L2-normed q / k, β gate, sigmoid-gated output norm) interleaved 3:1 with NoPE
MLA, a dense first layer then DeepSeek-V3-style MoE (sigmoid routing with the correction bias, expert groups,
shared experts); detection without config.json; a mismatched tensor named in one line; int8 (the kernels:
tests/test_kda.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from blazr.config import KimiDeltaConfig, MLAConfig
from blazr.errors import CheckpointError, UnsupportedError
from tests.drive import full_logits
from tests.hf_parity import ParityTests, check_batched_equals_alone, check_cache_invariants, prompts
from tests.ssm_fixtures import detect_with, layer_kinds, load_pair, runtime_free, single_thread

# 2 KDA heads of 16; MLA 4 heads (nope 16, rope 8, value 16, latent 32); 4 experts in 2 groups, top-2.
SIZES = dict(
    hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=16, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    n_group=2, topk_group=1, linear_head_dim=16, linear_num_heads=2, linear_conv_kernel_dim=4, pad_token_id=0,
    bos_token_id=1, eos_token_id=2, initializer_range=0.05,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp("kimi"), "kimi-linear", "KimiLinearForCausalLM", **SIZES)


def test_detected_config(pair):
    cfg = pair.llm.config
    assert layer_kinds(cfg) == ["kda+mlp", "kda+moe", "kda+moe", "mla+moe"]
    kda = cfg.layers[0].mixer(KimiDeltaConfig)
    assert (kda.num_heads, kda.head_dim, kda.conv_kernel, kda.norm_eps) == (2, 16, 4, 1e-5)
    mla = cfg.layers[3].mixer(MLAConfig)
    assert mla.rope.scaling == "none" and mla.softmax_scale == 24**-0.5 and mla.q_lora_rank is None
    moe = cfg.layers[1].moe
    assert (moe.scoring, moe.num_groups, moe.topk_groups, moe.group_score) == ("sigmoid", 2, 1, "top2_sum")
    assert moe.has_correction_bias and moe.is_renormalized and moe.routed_scaling_factor == 2.446
    assert moe.shared is not None and moe.shared.intermediate_size == 32


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_state_bytes_per_sequence(pair):
    """Per KDA layer: conv 3·H·Dh × (K − 1) in float32 and the [H, Dh, Dh] float32 state."""
    per_layer = 3 * 32 * 3 * 4 + 2 * 16 * 16 * 4
    cache = pair.llm.runner.cache
    assert sum(t[0].numel() * t.element_size() for t in cache.state) == 3 * per_layer


def test_detected_without_config_json(pair, tmp_path):
    """Only tensors: the same model but what no shape carries (top-k, the scaling factor: defaults)."""
    found = detect_with(pair.path, tmp_path / "bare", None)
    want = pair.llm.config
    assert [layer.mixers for layer in found.layers] == [layer.mixers for layer in want.layers]
    assert runtime_free(found).layers[0] == runtime_free(want).layers[0]
    assert found.layers[1].moe.num_experts == 4 and found.layers[1].moe.top_k == 4  # min(8, E)


def test_mismatched_tensor_named(pair, tmp_path):
    """A dt_bias of the wrong width: one line naming the tensor, expected and found."""
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "bad"
    dst.mkdir()
    shutil.copy(pair.path / "config.json", dst / "config.json")
    tensors = load_file(pair.path / "model.safetensors")
    tensors["model.layers.1.self_attn.dt_bias"] = torch.zeros(30)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((dst / "config.json").read_text())
    assert raw["model_type"] == "kimi_linear"
    said = r"model\.layers\.1\.self_attn\.dt_bias: expected \[32\] features \(2 heads of 16\), found \[30\]$"
    with pytest.raises(CheckpointError, match=said):
        detect_with(dst, tmp_path / "bad2", lambda c: None)


def test_quantize_int8(pair):
    """`--quantize int8`: every KDA and MLA linear, the MLP, the shared experts and the head become Q8_0 (the
    head q8_0g, the others the layout a GGUF's Q8_0 runs as here: `q8_packed.runs_as`), each exactly the
    float weight quantized (f_b_proj / g_b_proj read Dh = 16 features here, under a block of 32: kept
    float32, as every such linear); logits stay close to the float model's, cached decode steps and chunked
    prefill agree with the cacheless forward, batched greedy equals alone."""
    from blazr import LLM
    from blazr.kernels import q8_packed
    from blazr.kernels.quant import quantize
    from blazr.model.qlinear import QuantizedLinear

    llm = LLM(pair.path, cpu=True, dtype="float32", quantize="int8", max_num_seqs=4)
    plain = pair.llm.model
    wrapped = {n: m for n, m in llm.model.named_modules() if isinstance(m, QuantizedLinear)}
    kda = ("qkv_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj", "b_proj", "o_proj")
    names = [f"layers.0.kda.{leaf}" for leaf in kda] + ["layers.0.mlp.gate_up_proj", "layers.0.mlp.down_proj"]
    names += ["layers.3.mla.kv_a_proj", "layers.3.mla.o_proj", "layers.1.moe.shared.gate_up_proj", "lm_head"]
    for name in names:
        got, float_weight = wrapped[name], plain.get_submodule(name).weight.detach()
        q8 = "q8_0g" if name == "lm_head" else q8_packed.runs_as()
        kind = "f32" if float_weight.shape[1] % 32 else q8
        assert got.kind == kind, name
        assert torch.equal(got.qweight.data, quantize(float_weight, kind).data), name
    assert sum(wrapped[n].kind in ("q8_0g", q8_packed.runs_as()) for n in names) == len(names) - 2
    batch = prompts([40, 25], seed=6, vocab=llm.config.vocab_size)
    got, want = torch.cat(full_logits(llm.runner, batch)), torch.cat(full_logits(pair.llm.runner, batch))
    top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    kl = float(F.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="batchmean"))
    assert top1 >= 0.6 and 0 < kl <= 0.1, (top1, kl)
    check_cache_invariants(llm, 0.15)  # 8-bit activations and the float16 latent cache (as Qwen3.5's)
    check_batched_equals_alone(llm)


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("mla_use_nope", False, "mla_use_nope = false"),
        ("moe_router_activation_func", "softmax", "routes by sigmoid"),
    ],
)
def test_unsupported_switches_are_refused(pair, tmp_path, key, value, said):
    def edit(raw):
        raw[key] = value

    with pytest.raises(UnsupportedError, match=said):
        detect_with(pair.path, tmp_path / "edited", edit)


def test_rope_tables_sized_by_the_engine_context(pair):
    """Rope tables cover the engine's max_model_len, not the checkpoint's whole context (Kimi declares 1M
    positions: 256 MB of cos / sin tables at rope dim 64)."""
    from blazr import LLM
    from blazr.model.rope import RotaryEmbedding

    llm = LLM(pair.path, cpu=True, dtype="float32", max_num_seqs=2, max_model_len=64)
    ropes = [m for m in llm.model.modules() if isinstance(m, RotaryEmbedding)]
    assert ropes and llm.config.max_position_embeddings > 64
    assert all(r.cos.shape[0] == r.sin.shape[0] == 64 for r in ropes)
