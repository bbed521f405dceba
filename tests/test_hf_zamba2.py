"""Zamba2ForCausalLM parity with transformers: Mamba2 layers and hybrid layers that call shared transformer
blocks on concat(hidden, embeddings). Two models: "two-blocks" — 2 shared blocks called in turn by 3 hybrid
layers (blocks 0, 1, 0), q/k/v and gate_up adapters per call, rope in the shared attention, 2 Mamba2
groups; "one-block-bias" — one block called twice, gate_up adapters only, NoPE, GQA, biases in the Mamba2 and
MLP projections. Checked: logits, greedy tokens, cache invariants and batched == alone (ParityTests); the
shared weights held once with a KV cache per call; the prefix cache on == off; `--quantize int8` (every
shared, call and Mamba2 linear in Q8_0); detection without config.json; tensor parallel 2 ranks == 1."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

from blazr import LLM, SamplingParams
from blazr.config import EngineConfig, Mamba2Config, Zamba2SharedConfig
from blazr.detect.ssm_common import guess_head_dim
from blazr.distributed.shard import shard_config, slice_tensor
from blazr.errors import CheckpointError, UnsupportedError
from blazr.kernels import q8_packed
from blazr.model import mixers
from blazr.model.qlinear import QuantizedLinear
from blazr.model.zamba2_shared import SharedCall
from tests.drive import full_logits
from tests.hf_parity import ParityTests, check_batched_equals_alone, check_cache_invariants, prompts
from tests.ssm_fixtures import (
    Pair,
    check_without_config_json,
    detect_with,
    load_pair,
    map_layers,
    single_thread,
)

ARCH = "Zamba2ForCausalLM"
COMMON = dict(
    num_attention_heads=4,
    num_key_value_heads=2,
    n_mamba_heads=8,
    mamba_d_state=16,
    intermediate_size=96,
    chunk_size=8,
    adapter_rank=32,
)
VARIANTS = {
    "two-blocks": dict(
        COMMON,
        num_hidden_layers=5,
        layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid"],
        num_mem_blocks=2,
        use_shared_attention_adapter=True,
        num_key_value_heads=4,  # transformers' k / v adapters are 2D wide: as many KV heads as heads
        use_mem_rope=True,
        mamba_ngroups=2,
    ),
    "one-block-bias": dict(
        COMMON,
        num_hidden_layers=3,
        layers_block_type=["hybrid", "mamba", "hybrid"],
        num_mem_blocks=1,
        add_bias_linear=True,
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory) -> Pair:
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, ARCH, **VARIANTS[request.param])


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def _calls(cfg) -> list[Zamba2SharedConfig]:
    return [m for layer in cfg.layers if (m := layer.mixer(Zamba2SharedConfig)) is not None]


def test_detected_config_and_shared_weights_held_once(pair):
    cfg, c = pair.llm.config, pair.hf.config
    kinds = ["zamba2_shared+mamba2" if k == "hybrid" else "mamba2" for k in c.layers_block_type]
    assert [layer.kind for layer in cfg.layers] == kinds
    calls = _calls(cfg)
    assert [m.block for m in calls] == [j % c.num_mem_blocks for j in range(len(calls))]
    attention = calls[0].attention
    assert (attention.head_dim, attention.softmax_scale) == (
        c.attention_head_dim,
        (c.attention_head_dim / 2) ** -0.5,
    )
    assert (attention.rope is not None) == c.use_mem_rope
    assert calls[0].mlp.activation == "gelu_erf"
    assert {m.attention_adapter_rank for m in calls} == {32 if c.use_shared_attention_adapter else None}
    assert {m.n_groups for layer in cfg.layers if (m := layer.mixer(Mamba2Config))} == {c.mamba_ngroups}
    model = pair.llm.model
    assert len(model.shared_blocks) == c.num_mem_blocks
    linears = [n for n, x in model.named_modules() if isinstance(x, (torch.nn.Linear, QuantizedLinear))]
    shared = [n for n in linears if n.startswith("shared_blocks.")]
    assert len(shared) == 6 * c.num_mem_blocks  # q, k, v, o, gate_up, down: once per block
    assert not [n for n in linears if n.startswith("layers.") and n.endswith(("q_proj", "gate_up_proj"))]
    for layer, m in zip(model.layers, cfg.layers, strict=True):  # a KV cache per call, beside its state
        if m.mixer(Zamba2SharedConfig) is not None:
            assert (
                isinstance(layer.shared, SharedCall)
                and layer.shared._block[0] is model.shared_blocks[layer.shared.cfg.block]
            )
    layout = pair.llm.runner.cache
    kv_layers = [i for i, lc in enumerate(layout.layers) if hasattr(lc, "k")]
    assert kv_layers == [i for i, k in enumerate(c.layers_block_type) if k == "hybrid"]


def test_prefix_cache_on_equals_off(pair):
    """A shared prefix of 3 blocks and a repeat: the cached run resumes from the Mamba2 snapshots and each
    call's KV blocks, with the uncached run's tokens and logprobs."""

    def load(is_cached: bool) -> LLM:
        engine = EngineConfig(
            max_num_seqs=4, max_model_len=256, block_size=16, enable_prefix_caching=is_cached,
            state_snapshot_interval=2, cache_memory_gib=0.1,
        )  # fmt: skip
        return LLM(pair.path, cpu=True, dtype="float32", engine_config=engine)

    on, off = load(True), load(False)
    shared = prompts([50], seed=8, vocab=1024)[0]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1, ignore_eos=True)
    batch = [[*shared, 7, 8, 9], [*shared, 10, 11]]
    for _ in range(2):
        got, want = on.generate(batch, params), off.generate(batch, params)
        for a, b in zip(got, want, strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
            x = torch.tensor([lp.logprob for lp in a.outputs[0].logprobs])
            y = torch.tensor([lp.logprob for lp in b.outputs[0].logprobs])
            torch.testing.assert_close(x, y, atol=1e-4, rtol=0)
    assert [r.num_cached_tokens for r in got] == [48, 48]


def test_quantize_int8(pair):
    """`--quantize int8`: the shared blocks' linears (once each), every call's adapters and output linear and
    the Mamba2 projections are Q8_0; cached schedules agree with the cacheless forward; batched == alone; the
    logits stay near the float model's."""
    # float32 keys and values: `auto` keeps them in float16 under int8, whose rounding these tiny random
    # models amplify further (measured up to 45% of the logit scale between cached and cacheless runs)
    llm = LLM(pair.path, cpu=True, dtype="float32", quantize="int8", max_num_seqs=4, kv_cache_dtype="float32")
    model = llm.model
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert isinstance(model.shared_blocks[0].attn.get_submodule(name), QuantizedLinear)
    for name in ("gate_up_proj", "down_proj"):
        assert isinstance(model.shared_blocks[0].mlp.get_submodule(name), QuantizedLinear)
    call = next(layer.shared for layer in model.layers if hasattr(layer, "shared"))
    for name in ("linear", "gate_up_adapter.0", "gate_up_adapter.1"):
        linear = call.get_submodule(name)
        assert isinstance(linear, QuantizedLinear) and linear.qweight.kind == q8_packed.runs_as(), name
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules()), "a linear left float"
    # A chunk's attention sums in another order (~1e-6); where that moves an activation across an 8-bit
    # rounding step, these tiny random models amplify it (measured: up to 15% of the logit scale, all from
    # rows that start a chunk; 0 on the float model), as on the other int8 hybrids (test_hf_olmo_hybrid)
    check_cache_invariants(llm, 0.2)
    check_batched_equals_alone(llm)
    batch = prompts([40, 25], seed=6, vocab=llm.config.vocab_size)
    for got, want in zip(full_logits(llm.runner, batch), full_logits(pair.llm.runner, batch), strict=True):
        kl = F.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="batchmean")
        assert kl <= 0.1, kl  # measured 0.02-0.05 on these very sensitive tiny models


def test_two_ranks_give_one_ranks_tokens_and_logprobs(pair):
    """Tensor parallel 2 == 1: the shared blocks split by heads and MLP width (o_proj's partial sums added
    before ffn_norm), each call's adapters with them, the Mamba2 layers by heads — the same greedy tokens and
    logprobs within float32 rounding."""
    from tests.test_tensor_parallel import check_two_ranks_match_one

    check_two_ranks_match_one(pair.path)


def test_the_shards_add_up(pair):
    """The ranks' pieces of a shared block's and a call's tensors tile the whole; norms and the adapters'
    down projections are whole on every rank; a width that does not divide is refused with one line."""
    cfg = pair.llm.config
    call, part = _calls(cfg)[0], _calls(shard_config(cfg, 2))[0]
    a, I = call.attention, call.mlp.intermediate_size
    assert (part.attention.num_heads * 2, part.attention.num_kv_heads * 2) == (a.num_heads, a.num_kv_heads)
    assert part.mlp.intermediate_size * 2 == I and part.attention_adapter_rank == call.attention_adapter_rank
    D = cfg.hidden_size
    q, o = torch.randn(a.num_heads * a.head_dim, 2 * D), torch.randn(D, a.num_heads * a.head_dim)
    gate_up, down = torch.randn(2 * I, D), torch.randn(D, I)

    def pieces(name, t):
        return [slice_tensor(name, t, cfg, r, 2) for r in range(2)]

    assert torch.equal(torch.cat(pieces("shared_blocks.0.attn.q_proj.weight", q)), q)
    assert torch.equal(torch.cat(pieces("shared_blocks.0.attn.o_proj.weight", o), dim=1), o)
    assert torch.equal(torch.cat(pieces("shared_blocks.0.mlp.down_proj.weight", down), dim=1), down)
    for r, piece in enumerate(pieces("shared_blocks.0.mlp.gate_up_proj.weight", gate_up)):
        assert torch.equal(piece, torch.cat([h.chunk(2)[r] for h in gate_up.chunk(2)]))  # gate and up rows
    layer = next(i for i, layer in enumerate(cfg.layers) if layer.mixer(Zamba2SharedConfig) is not None)
    up = torch.randn(2 * I, call.mlp_adapter_rank)
    for r, piece in enumerate(pieces(f"layers.{layer}.shared.gate_up_adapter.1.weight", up)):
        assert torch.equal(piece, torch.cat([h.chunk(2)[r] for h in up.chunk(2)]))
    for whole in ("shared_blocks.0.input_norm.weight", f"layers.{layer}.shared.gate_up_adapter.0.weight"):
        t = torch.randn(4, 4)
        assert slice_tensor(whole, t, cfg, 1, 2) is t
    bias = torch.randn(D)
    assert torch.equal(sum(pieces("shared_blocks.0.mlp.down_proj.bias", bias)), bias)  # counted once
    refused = "tensor parallel 3: layer 1's Zamba2 shared attention heads is 4, not divisible by 3"
    with pytest.raises(UnsupportedError, match=re.escape(refused)):
        mixers.spec_of(call).shard(call, 3, "layer 1's")


def _not_inferable(cfg):
    """What no shape carries takes transformers' defaults — no rope (use_mem_rope), one Mamba2 group (the
    state then n_groups × state wide) — and the heads the common head size of q and k that divides both."""

    def call(m: Zamba2SharedConfig) -> Zamba2SharedConfig:
        a = m.attention
        q_rows, kv_rows = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        hd = guess_head_dim(q_rows, kv_rows)
        heads = dict(num_heads=q_rows // hd, num_kv_heads=kv_rows // hd, head_dim=hd)
        attention = dataclasses.replace(a, **heads, softmax_scale=(hd / 2) ** -0.5, rope=None)
        return dataclasses.replace(m, attention=attention)

    def mamba(m: Mamba2Config) -> Mamba2Config:
        return dataclasses.replace(
            m, n_groups=1, state_size=m.n_groups * m.state_size, norm_group_size=m.d_inner
        )

    return map_layers(cfg, zamba2_shared=call, mamba2=mamba)


def test_without_config_json(pair, tmp_path):
    check_without_config_json(pair, tmp_path, _not_inferable)


def test_a_missing_shared_block_names_the_tensor(pair, tmp_path):
    """config.json's num_mem_blocks asks for one block more than the checkpoint holds: one line naming the
    tensor, what was expected and where the blocks were found."""
    more = pair.hf.config.num_mem_blocks + 1
    want = rf"shared_transformer.input_layernorm.weight: expected the weights of {more} shared blocks"
    with pytest.raises(CheckpointError, match=want):
        detect_with(pair.path, tmp_path, lambda raw: raw.update(num_mem_blocks=more))
