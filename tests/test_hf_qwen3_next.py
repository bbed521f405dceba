"""Qwen3.5 / 3.6 (dense and MoE) and Qwen3-Next parity with transformers: gated DeltaNet layers (grouped value
heads, Hv = 2·Hk) and gated attention (sigmoid output gate, per-head (1 + w) q/k norm, partial rope) with
(1 + w) RMSNorms, a SwiGLU MLP or a MoE with a sigmoid-gated shared expert (Qwen3-Next: dense and MoE layers
mixed by decoder_sparse_step / mlp_only_layers); the `…ForConditionalGeneration` checkpoint's language model
without its vision tower; the recurrent state's bytes."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from blazr.config import AttentionConfig, GatedDeltaNetConfig
from tests.drive import assert_logits_close, full_logits
from tests.hf_parity import ParityTests, check_batched_equals_alone, check_cache_invariants, prompts
from tests.ssm_fixtures import layer_kinds, load_pair, randomise, single_thread
from tests.tiny import hf_logits

# 4 attention heads of 32 (a quarter rotated), 2 DeltaNet key heads of 16 read by 4 value heads of 24. The
# DeltaNet layers make these random models sensitive — transformers' logits move by 5e-5 of their scale when
# the embedding is perturbed by 1e-7 at initializer_range 0.1 (Llama's: 7e-6), our fp32 rounding's size —
# so weights at half TINY's range (1.5e-5), where fp32 parity at 1e-4 holds with a margin.
SIZES = dict(
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
    initializer_range=0.05,
)  # fmt: skip
EXPERTS = dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=96
)
VARIANTS = {
    "qwen3_5": ("Qwen3_5ForCausalLM", dict(SIZES, num_hidden_layers=4)),
    "qwen3_5-moe": ("Qwen3_5MoeForCausalLM", dict(SIZES, **EXPERTS, num_hidden_layers=4,
                                                  tie_word_embeddings=True)),
    "qwen3-next": ("Qwen3NextForCausalLM", dict(SIZES, **EXPERTS, num_hidden_layers=4, decoder_sparse_step=2,
                                                mlp_only_layers=[3], norm_topk_prob=False)),
}  # fmt: skip
KINDS = {
    "qwen3_5": ["deltanet+mlp", "deltanet+mlp", "deltanet+mlp", "attention+mlp"],
    "qwen3_5-moe": ["deltanet+moe", "deltanet+moe", "deltanet+moe", "attention+moe"],
    "qwen3-next": ["deltanet+mlp", "deltanet+moe", "deltanet+mlp", "attention+mlp"],
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, arch, **overrides)


def test_detected_config(pair):
    cfg, c = pair.llm.config, pair.hf.config
    assert layer_kinds(cfg) == KINDS[pair.name]
    dn = cfg.layers[0].mixer(GatedDeltaNetConfig)
    assert (dn.num_k_heads, dn.num_v_heads, dn.head_k_dim, dn.head_v_dim) == (2, 4, 16, 24)
    attn = cfg.layers[3].mixer(AttentionConfig)
    assert attn.has_output_gate and attn.is_qk_norm_per_head and attn.rope.dim == 8  # 0.25 of 32
    assert attn.qk_norm.weight_offset == cfg.final_norm.weight_offset == 1.0
    moe = next((layer.moe for layer in cfg.layers if layer.moe), None)
    if moe is not None:
        assert moe.has_shared_gate and moe.is_renormalized == (pair.name != "qwen3-next")
    assert cfg.tie_word_embeddings == c.tie_word_embeddings


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_state_bytes_per_sequence(pair):
    """Per DeltaNet layer: conv (2·Hk·Dk + Hv·Dv) × (K − 1) in float32 and the [Hv, Dk, Dv] float32 state."""
    per_layer = (2 * 2 * 16 + 4 * 24) * 3 * 4 + 4 * 16 * 24 * 4
    cache = pair.llm.runner.cache
    assert sum(t[0].numel() * t.element_size() for t in cache.state) == 3 * per_layer


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    """A `Qwen3_5ForConditionalGeneration` checkpoint (tiny vision tower) and its HF model."""
    import transformers

    text = dict(
        SIZES, vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        max_position_embeddings=512, initializer_range=0.1,
    )  # fmt: skip
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128,
                  patch_size=4, temporal_patch_size=1, spatial_merge_size=2)  # fmt: skip
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForConditionalGeneration(config).float().eval()
    randomise(hf, 1)
    path = tmp_path_factory.mktemp("qwen3_5-vl")
    hf.save_pretrained(path)
    return hf, path


def test_conditional_generation_loads_its_language_model(vl, caplog):
    from blazr import LLM

    hf, path = vl
    with caplog.at_level(logging.INFO, logger="blazr"):
        llm = LLM(path, cpu=True, dtype="float32", max_num_seqs=2)
    assert llm.config.architecture == "Qwen3_5ForConditionalGeneration"
    said = [r.getMessage() for r in caplog.records if "vision tower" in r.getMessage()]
    assert len(said) == 1 and "not loaded" in said[0]
    assert not [r for r in caplog.records if "ignored" in r.getMessage()]  # no tensor-by-tensor warning
    for p in prompts([9, 30], seed=5, vocab=1024):
        assert_logits_close(full_logits(llm.runner, [p])[0], hf_logits(hf, p))


@pytest.mark.parametrize("mode, kind", [("int8", "q8_0g"), ("int4", "q4_1"), ("bf16", "bf16")])
def test_quantize(pair, mode, kind):
    """`--quantize int8 / int4 / bf16`: every DeltaNet and attention linear, the MLP, the shared expert and
    the head become `kind` (int8: the head q8_0g, the others the layout a GGUF's Q8_0 runs as here,
    `q8_packed.runs_as`), each exactly the float weight quantized — rows picked from Qwen3.5's in_proj_qkv,
    Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba and q_proj's [q; gate] by address, in the C
    quantizer — routed experts stacked; logits stay close to the float model's, cached decode steps and
    chunked prefill agree with the cacheless forward, batched greedy equals alone."""
    from blazr import LLM
    from blazr.kernels import q8_packed
    from blazr.kernels.quant import quantize
    from blazr.model.moe import Experts
    from blazr.model.qlinear import QuantizedLinear

    llm = LLM(pair.path, cpu=True, dtype="float32", quantize=mode, max_num_seqs=4)
    plain = pair.llm.model
    head_kind, kind = kind, q8_packed.runs_as() if mode == "int8" else kind
    quantized = {
        n: m for n, m in llm.model.named_modules() if isinstance(m, QuantizedLinear) and m.kind != "f32"
    }
    for i, layer in enumerate(llm.config.layers):
        mixer = "deltanet" if layer.mixer(GatedDeltaNetConfig) else "attn"
        leaves = ("in_proj_qkvz", "in_proj_ba", "out_proj") if mixer == "deltanet" else ("qkv_proj", "o_proj")
        ffn = (
            ("mlp.gate_up_proj", "mlp.down_proj")
            if layer.mlp
            else ("moe.shared.gate_up_proj", "moe.shared.down_proj")
        )
        for name in [f"layers.{i}.{mixer}.{leaf}" for leaf in leaves] + [f"layers.{i}.{f}" for f in ffn]:
            got, float_weight = quantized[name], plain.get_submodule(name).weight.detach()
            assert got.kind == kind, name
            assert torch.equal(got.qweight.data, quantize(float_weight, kind).data), name
    assert quantized["lm_head"].kind == head_kind
    if mode == "int8" and pair.name != "qwen3_5":
        assert all(e.w_up is not None for e in llm.model.modules() if isinstance(e, Experts))
    batch = prompts([40, 25], seed=6, vocab=llm.config.vocab_size)
    got, want = torch.cat(full_logits(llm.runner, batch)), torch.cat(full_logits(pair.llm.runner, batch))
    top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    kl = float(F.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="batchmean"))
    # these random models are sensitive (the gated norm and the q/k L2 norms renormalise small vectors):
    # transformers' own logits move by 0.2 of their scale when the embedding alone is rounded to bf16;
    # measured top-1 / KL — int8: 0.85 / 0.012, 0.66 / 0.069 (Qwen3.5-MoE: routing flips at near-ties),
    # 0.85 / 0.016 (Qwen3-Next); int4: 0.26 / 0.31, 0.15 / 0.54, 0.38 / 0.29; bf16: 0.97 / 4e-4, 0.94 /
    # 0.018, 0.94 / 1e-3
    low_top1, high_kl = {"int8": (0.6, 0.1), "int4": (0.1, 1.0), "bf16": (0.9, 0.03)}[mode]
    assert top1 >= low_top1 and 0 < kl <= high_kl, (top1, kl)
    # decode steps (the recurrence) and chunked prefills (the WY form) differ at fp32 rounding, which 8-bit
    # activations and the float16 KV cache (the default with quantized weights) turn into visible changes
    # on these sensitive models: measured up to 0.05 of the logit scale (int8); a wrong path is O(1)
    check_cache_invariants(llm, 0.15)
    check_batched_equals_alone(llm)


@pytest.mark.parametrize("pair", ["qwen3_5-moe"], indirect=True)
def test_fused_expert_tensors(pair, tmp_path):
    """transformers' own names (`save_original_format=False`): the experts as fused 3-D tensors
    (`mlp.experts.gate_up_proj` [E, 2I, D], `down_proj` [E, D, I]) load to the same model."""
    from blazr import LLM

    pair.hf.save_pretrained(tmp_path, save_original_format=False)
    llm = LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=2)
    batch = prompts([20], seed=9, vocab=llm.config.vocab_size)
    assert torch.equal(full_logits(llm.runner, batch)[0], full_logits(pair.llm.runner, batch)[0])


def test_without_config_json(tmp_path):
    """No config.json: the tensor names say Qwen3.5 and the shapes every size (heads from the q_norm, the
    DeltaNet value heads from A_log, its key heads from the conv width at HF's key head size, 128); what
    no shape carries takes Qwen's defaults (rope θ 10000, partial rope 0.25, eps 1e-6, the layer kinds
    from where self_attn lies) — the same model as with it."""
    from blazr import LLM
    from tests.ssm_fixtures import detect_with, runtime_free

    sizes = dict(SIZES, linear_num_key_heads=1, linear_key_head_dim=128, linear_value_head_dim=32)
    pair = load_pair(tmp_path / "with", "qwen3_5-128", "Qwen3_5ForCausalLM", **sizes, num_hidden_layers=4)
    inferred = detect_with(pair.path, tmp_path / "without", None)
    assert runtime_free(inferred) == runtime_free(pair.llm.config)
    other = LLM(tmp_path / "without", cpu=True, dtype="float32", max_num_seqs=2)
    batch = prompts([13], seed=7, vocab=1024)
    assert torch.equal(full_logits(other.runner, batch)[0], full_logits(pair.llm.runner, batch)[0])
