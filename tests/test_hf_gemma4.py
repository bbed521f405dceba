"""Gemma 4 text parity with transformers on tiny random checkpoints: KV shared across layers (the last two
layers read the cache of the last sliding / full layer before them, with no k / v projections and double-wide
MLPs), K = V on the full layers (no v projection), their own head size and KV heads, proportional rope,
weightless value norms, per-layer input embeddings, a learned scalar per layer, sliding windows and the
final-logit soft-cap; the cache the shared layers do not hold; the older global_head_dim keys; the text
model of a Gemma4ForConditionalGeneration checkpoint; tensor parallelism by heads (one KV head refused in one
line); every CPU decode step one recorded plan (per-layer inputs, K = V values, the MoE's scales as kernel
ops); the per-layer table read by rows, as stored (most of a real checkpoint: 2.35B entries at E2B)."""

from __future__ import annotations

import json

import pytest
import torch

from blazr import LLM
from blazr.config import AttentionConfig
from blazr.distributed.shard import shard_config
from blazr.errors import UnsupportedError
from blazr.kernels import q8_packed
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.mixers import cache_layout
from blazr.model.qlinear import QuantizedLinear
from tests.hf_parity import ParityTests, check_cache_invariants, check_greedy, check_logits
from tests.ssm_fixtures import Pair, detect_with, randomise, single_thread
from tests.tiny import TINY, build

S, F = "sliding_attention", "full_attention"
SIZES = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_hidden_layers=6,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=1024,
    sliding_window=12,
    layer_types=[S, S, S, F, S, F],  # llama.cpp assumes the last unshared layers S, F
    final_logit_softcapping=30.0,
    rope_parameters=dict(
        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
        full_attention=dict(rope_type="proportional", partial_rotary_factor=0.25, rope_theta=1000000.0),
    ),
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@torch.no_grad()
def randomise_gemma4(hf: torch.nn.Module, seed: int) -> None:
    """Random norms, biases (ssm_fixtures.randomise), layer scalars (a buffer transformers sets to 1) and
    the MoE router's input and per-expert scales (ones)."""
    randomise(hf, seed)
    g = torch.Generator().manual_seed(seed)
    for name, b in hf.named_buffers():
        if name.endswith("layer_scalar"):
            b.copy_(0.5 + torch.rand(b.shape, generator=g))
    for name, p in hf.named_parameters():
        if name.endswith(("router.scale", "router.per_expert_scale")):
            p.copy_(0.5 + torch.rand(p.shape, generator=g))


def load(root, seed: int = 0, **overrides) -> Pair:
    hf = build("Gemma4ForCausalLM", root, seed=seed, **{**SIZES, **overrides})
    randomise_gemma4(hf, seed + 1)
    hf.save_pretrained(root)
    return Pair(hf, LLM(root, cpu=True, dtype="float32", max_num_seqs=8), root)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load(tmp_path_factory.mktemp("gemma4"))


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""

    def test_cache_invariants(self, pair) -> None:
        """At 2e-4: on the 70-token prompt the whole forward lies 6.9e-5 from transformers and the 7-token
        chunks 9.1e-5 (both within the 1e-4 the logits test holds), on opposite sides: 1.6e-4 apart."""
        check_cache_invariants(pair.llm, rel=2e-4)


def test_detected_config(pair):
    cfg = pair.llm.config
    attn = [layer.mixer(AttentionConfig) for layer in cfg.layers]
    assert [a.kv_source for a in attn] == [None, None, None, None, 2, 3]
    assert [a.sliding_window for a in attn] == [12, 12, 12, None, 12, None]
    assert [(a.head_dim, a.num_kv_heads, a.is_v_from_k) for a in attn] == [
        (16, 2, False), (16, 2, False), (16, 2, False), (32, 1, True), (16, 2, False), (32, 1, True)
    ]  # fmt: skip
    full = attn[3].rope
    assert (full.dim, full.scaling, full.proportion, full.theta) == (32, "proportional", 0.25, 1e6)
    assert all(a.softmax_scale == 1.0 and a.has_v_norm and a.qk_norm.weight_offset == 0 for a in attn)
    assert [layer.mlp.intermediate_size for layer in cfg.layers] == [96] * 4 + [192] * 2
    assert all(layer.has_output_scale for layer in cfg.layers)
    assert cfg.per_layer_input.size == 8 and cfg.final_logit_softcap == 30.0
    assert cfg.tie_word_embeddings and cfg.embedding_multiplier == 64**0.5


def test_shared_layers_hold_no_cache(pair):
    """The sharing layers declare no pool: the engine's cache holds K / V for the first four layers only, and
    layers 4 and 5 are handed layers 2's and 3's tensors themselves."""
    layout = cache_layout(pair.llm.config)
    assert [layer.source for layer in layout.layers] == [None] * 4 + [2, 3]
    assert [len(layer.paged) for layer in layout.layers] == [2, 2, 2, 2, 0, 0]
    per_token = 4 * (3 * 2 * 16 * 2 + 1 * 32 * 2)  # float32: 3 sliding layers [2, 16] K and V, 1 full [1, 32]
    assert layout.bytes_per_token(torch.float32) == per_token
    cache = pair.llm.runner.cache
    assert cache.layer(4) is cache.layer(2) and cache.layer(5) is cache.layer(3)
    assert len(cache.paged) == 8


MOE = dict(enable_moe_block=True, num_experts=6, top_k_experts=2, moe_intermediate_size=32)


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_every_decode_step_is_one_recorded_plan(variant, request):
    """The CPU decode step — per-layer inputs and gates, the K = V layers' values normed from the k rows,
    the layer scalars, the MoE's input norm and per-expert scales — records as one plan (no eager
    fallback), and the tokens it gives are transformers'."""
    pair = request.getfixturevalue("pair" if variant == "dense" else "moe_pair")
    plan = pair.llm.runner.decode_plan
    assert plan is not None
    before = plan.num_runs
    check_greedy(pair.hf, pair.llm, n=8)
    assert plan.num_runs >= before + 7  # every decode step after the prefill's token


def test_the_per_layer_table_is_read_by_rows(tmp_path):
    """A bf16 checkpoint's per-layer table stays its mapped bf16 rows (a lookup widens them exactly: the
    logits are transformers' on the same file), under `--quantize int8` Q8_0 rows; the per-layer
    projection and gates are quantized with the other linears. A float32 checkpoint's table loads float.
    (Per-layer width 16: the table's rows, 6 · 16 wide, split into Q8_0 blocks of 32.)"""
    import transformers

    from tests.test_quantize import mapped_file

    f32 = load(tmp_path / "f32", seed=7, hidden_size_per_layer_input=16)
    assert isinstance(f32.llm.model.per_layer_inputs.embed, torch.nn.Embedding)
    f32.hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval()
    llm = LLM(tmp_path / "bf16", cpu=True, dtype="float32", max_num_seqs=8)
    table = llm.model.per_layer_inputs.embed
    assert isinstance(table, QuantizedEmbedding) and table.table.kind == "bf16"
    assert mapped_file(table.table.data.data_ptr()) is not None  # a view of the checkpoint, no copy
    check_logits(hf, llm)
    int8 = LLM(tmp_path / "bf16", cpu=True, dtype="float32", max_num_seqs=8, quantize="int8")
    per_layer = int8.model.per_layer_inputs
    assert isinstance(per_layer.embed, QuantizedEmbedding) and per_layer.embed.table.kind == "q8_0"
    gates = [per_layer.proj, *(layer.per_layer.gate for layer in int8.model.layers)]
    assert all(isinstance(g, QuantizedLinear) and g.kind == q8_packed.runs_as() for g in gates)


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory):
    return load(tmp_path_factory.mktemp("gemma4_moe"), seed=5, **MOE)


class TestMoEParity(ParityTests):
    """The MoE variant (26B-A4B's shape: every layer an MLP beside a MoE) against transformers."""

    @pytest.fixture
    def pair(self, moe_pair):
        return moe_pair


def test_moe_detected_config(moe_pair):
    layer = moe_pair.llm.config.layers[0]
    assert layer.mlp is not None and layer.moe is not None
    assert (layer.moe.num_experts, layer.moe.top_k, layer.moe.expert.intermediate_size) == (6, 2, 32)
    assert layer.moe.input_norm is not None and layer.moe.has_expert_scale
    assert layer.mlp_post_norm is not None and layer.moe_post_norm is not None


def test_moe_reference_loop_equals_grouped(moe_pair):
    """The MoE's grouped experts equal its plain per-token loop (with Gemma 4's own input norms)."""
    moe = moe_pair.llm.model.layers[1].moe
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(moe(x), moe.forward_reference(x), rtol=1e-5, atol=1e-5)


def test_without_k_eq_v_and_per_layer_inputs(tmp_path):
    """Every layer its own k and v projections (no sharing: transformers 5.24 cannot run shared layers
    without per-layer inputs — it slices them unconditionally), no per-layer inputs, a default rope on the
    full layers too: logits equal transformers'."""
    pair = load(
        tmp_path, seed=3, attention_k_eq_v=False, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
        use_double_wide_mlp=False, final_logit_softcapping=None,
        rope_parameters=dict(sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                             full_attention=dict(rope_type="default", rope_theta=50000.0)),
    )  # fmt: skip
    cfg = pair.llm.config
    assert cfg.per_layer_input is None and cfg.final_logit_softcap is None
    attn = [layer.mixer(AttentionConfig) for layer in cfg.layers]
    assert all(a.kv_source is None and not a.is_v_from_k for a in attn)
    check_logits(pair.hf, pair.llm)


def test_older_global_head_dim_keys(pair, tmp_path):
    """A config.json with global_head_dim / num_global_key_value_heads instead of per_layer_config (the
    Hub's first Gemma 4 files) detects the same model."""

    def edit(raw):
        raw.pop("per_layer_config")
        raw.update(global_head_dim=32, num_global_key_value_heads=1)

    assert detect_with(pair.path, tmp_path, edit) == pair.llm.config


def test_conditional_generation_text_model(tmp_path):
    """Gemma4ForConditionalGeneration: the text model under model.language_model. (and text_config), the
    vision tower and embedder left unread; its text logits equal transformers'."""
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=8)  # fmt: skip
    text = dict(SIZES, vocab_size=TINY["vocab_size"], initializer_range=0.1, max_position_embeddings=512)
    config = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    torch.manual_seed(0)
    hf = transformers.Gemma4ForConditionalGeneration(config).float().eval()
    randomise_gemma4(hf, 1)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma4"
    llm = LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=8)
    assert llm.config.architecture == "Gemma4ForConditionalGeneration"
    # these weights are sensitive to rounding: on the 40-token prompt transformers fp32 lies 7.8e-5 from a
    # float64 forward and blazr 3.6e-5 (the same text model as Gemma4ForCausalLM gives the same logits)
    check_logits(hf, llm, rel=2e-4)


def test_tensor_parallel_splits_heads_or_refuses_in_one_line(pair):
    """Shared-KV and K = V layers split by heads like any attention (test_tensor_parallel runs Gemma 4 on
    2 ranks): a sharing layer keeps its source layer's KV heads per rank. The fixture's full layers have one
    KV head, which 2 ranks cannot split: refused in one line naming the first such layer."""
    cfg = pair.llm.config
    with pytest.raises(UnsupportedError, match="layer 3's KV heads is 1, not divisible by 2") as e:
        shard_config(cfg, 2)
    assert "\n" not in str(e.value)
    sliding = cfg.with_(
        layers=cfg.layers[:3] + cfg.layers[4:5]
    )  # 3 sliding layers, then one sharing layer 2's
    attn = [layer.mixer(AttentionConfig) for layer in shard_config(sliding, 2).layers]
    assert [(a.num_heads, a.num_kv_heads) for a in attn] == [(2, 1)] * 4
    assert attn[3].kv_source == 2 and sliding.per_layer_input is not None


def test_bidirectional_encoder_is_refused(pair, tmp_path):
    def edit(raw):
        raw["use_bidirectional_attention"] = "all"

    with pytest.raises(UnsupportedError, match="use_bidirectional_attention"):
        detect_with(pair.path, tmp_path, edit)
