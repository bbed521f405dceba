"""The fused CPU decode step (engine/decode_plan.py: the model's own forward, captured) against the eager
model: greedy tokens of batched generation identical with and without the plan (Llama, Qwen2 with q/k/v
bias, Mistral with a sliding window shorter than the sequences, Mamba2, a Granite attention + Mamba2 hybrid
with its multipliers, FalconH1, NemotronH, DeepSeek-V3's MLA + MoE, Mixtral, Granite with routed experts, the
DeltaNet, short-conv, Mamba1 and Kimi-Linear (KDA + NoPE MLA) hybrids),
batch sizes changing as sequences finish, one decode step's logits equal to the eager model's bit for bit
(float, Q8_0 weights, 16-bit KV), and `create` refusing — with the reason logged — what the kernels do not
cover."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from blazr import LLM, SamplingParams
from blazr.config import (
    AttentionConfig,
    EngineConfig,
    LayerConfig,
    Mamba2Config,
    MLAConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    RopeConfig,
)
from blazr.engine.decode_plan import DecodePlan
from blazr.engine.runner import ModelRunner
from blazr.engine.scheduler import ScheduledBatch
from blazr.engine.sequence import Sequence
from blazr.kernels import ops
from blazr.kernels.build import available
from blazr.kernels.quant import quantize
from blazr.loading.absorb import absorb_mla
from blazr.loading.quantize import wrap_float_linears
from blazr.model.mixers import cache_layout
from blazr.model.model import CausalLM
from blazr.model.qlinear import QuantizedLinear
from blazr.state.kv_cache import ModelCache
from tests.drive import place, release
from tests.ssm_fixtures import randomise
from tests.test_hf_deepseek import MLA_SIZES, MOE_SIZES
from tests.test_hf_gemma4 import SIZES as GEMMA4_SIZES
from tests.test_hf_kimi_linear import SIZES as KIMI_SIZES
from tests.test_hf_qwen3_next import EXPERTS as QWEN_EXPERTS
from tests.test_hf_qwen3_next import SIZES as QWEN_SIZES
from tests.test_hf_zamba2 import VARIANTS as ZAMBA2_SIZES
from tests.tiny import build


def test_kernel_library_is_available() -> None:
    assert available(), "the C kernel library is unavailable (no C compiler, or BLAZR_KERNELS=0)"


# Hybrids at tiny widths; GraniteMoeHybrid without experts (num_local_experts=0: its shared MLP only), with
# µP multipliers that all differ from 1.
_SSM = dict(
    mamba_n_heads=8, mamba_d_head=32, mamba_expand=2, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4
)
VARIANTS = {
    "llama": ("LlamaForCausalLM", {}),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "mistral-window": ("MistralForCausalLM", dict(sliding_window=24)),
    "mamba2": ("Mamba2ForCausalLM", dict(num_heads=8, head_dim=16, state_size=16, n_groups=1, expand=1)),
    "granite-hybrid": (
        "GraniteMoeHybridForCausalLM",
        dict(
            _SSM,
            layer_types=["mamba", "attention", "mamba"],
            num_hidden_layers=3,
            num_local_experts=0,
            shared_intermediate_size=96,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            logits_scaling=4.0,
            attention_multiplier=0.2,
        ),
    ),
    # Attention beside Mamba2 in every block, the gate without a Mamba norm, µP multipliers folded at load.
    "falcon-h1": (
        "FalconH1ForCausalLM",
        dict(
            mamba_n_heads=8,
            mamba_d_state=16,
            mamba_expand=2,
            num_hidden_layers=2,
            mamba_rms_norm=False,
            num_attention_heads=2,
            num_key_value_heads=1,
            embedding_multiplier=1.5,
            lm_head_multiplier=0.7,
            ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.7],
            mlp_multipliers=[1.3, 0.6],
        ),
    ),
    # MLA (q LoRA) with a dense first layer, then DeepSeek-V3's routed + shared experts.
    "deepseek-v3": (
        "DeepseekV3ForCausalLM",
        dict(MLA_SIZES, **MOE_SIZES, q_lora_rank=48, n_group=2, topk_group=1),
    ),
    "mixtral": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64)),
    # Granite 4.0-H with routed experts beside its shared MLP in every block.
    "granite-moe-hybrid": (
        "GraniteMoeHybridForCausalLM",
        dict(
            _SSM,
            layer_types=["mamba", "attention"],
            num_hidden_layers=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=64,
            shared_intermediate_size=96,
        ),
    ),
    # Mamba2, attention and ungated ReLU² MLP blocks.
    "nemotron-h": (
        "NemotronHForCausalLM",
        dict(
            hybrid_override_pattern="M*-M-",
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            mamba_num_heads=8,
            mamba_head_dim=32,
            ssm_state_size=16,
            n_groups=2,
            intermediate_size=96,
        ),
    ),
    # Nemotron 3 Super's latent MoE: the routed experts between biased projections into a 64-wide space.
    "nemotron-h-latent": (
        "NemotronHForCausalLM",
        dict(
            hybrid_override_pattern="M*E",
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            mamba_num_heads=8,
            mamba_head_dim=32,
            ssm_state_size=16,
            n_groups=2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            moe_shared_expert_intermediate_size=32,
            moe_latent_size=64,
            mlp_bias=True,
        ),
    ),
    # Gated DeltaNet and gated attention (q/k norm, partial rope); Qwen3-Next's MoE, its gated shared expert.
    "qwen3_5": ("Qwen3_5ForCausalLM", dict(QWEN_SIZES, num_hidden_layers=4)),
    "qwen3-next": ("Qwen3NextForCausalLM", dict(QWEN_SIZES, **QWEN_EXPERTS, num_hidden_layers=4)),
    # Kimi-Linear: KDA (channel-wise decay) + NoPE MLA, sigmoid-routed MoE with groups and shared experts.
    "kimi-linear": ("KimiLinearForCausalLM", KIMI_SIZES),
    # LFM2: short-conv layers around attention with q / k norms.
    "lfm2": ("Lfm2ForCausalLM", dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"])),
    # Jamba: Mamba1 (weighted dt / B / C norms) + NoPE attention + softmax MoE.
    "jamba": (
        "JambaForCausalLM",
        dict(
            num_hidden_layers=4,
            attn_layer_period=4,
            attn_layer_offset=1,
            num_experts=4,
            intermediate_size=96,
            mamba_dt_rank=8,
        ),
    ),
    # Zamba2: shared transformer blocks called on concat(x, embeddings) with per-call adapters, rope.
    "zamba2": ("Zamba2ForCausalLM", ZAMBA2_SIZES["two-blocks"]),
    # Gemma 4: per-layer inputs, KV shared across layers, K = V global layers, layer scalars, soft-cap.
    "gemma4": ("Gemma4ForCausalLM", GEMMA4_SIZES),
}
OVERRIDES = dict(VARIANTS.values())  # arch → its overrides
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _build(arch: str, path: Path, **overrides: object) -> None:
    """A tiny checkpoint; q/k/v biases (zero-initialised by transformers) and the state-space constants
    made random so that they count."""
    hf = build(arch, path, **overrides)
    randomise(hf, seed=11)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.normal_(0, 0.5)
    hf.save_pretrained(path)


def _llm(path: Path, fused: bool) -> LLM:
    # A small token budget chunks the prompts, so most steps mix decodes with a prefill chunk; a small cache
    # (the default, half the free memory, gave a tiny hybrid 72k recurrent-state slots: 2.7 GB that each
    # `_states` snapshot copied)
    cfg = EngineConfig(
        max_num_seqs=8,
        max_model_len=512,
        max_num_batched_tokens=16,
        fused_decode=fused,
        cache_memory_gib=0.25,
    )
    return LLM(path, cpu=True, dtype="float32", engine_config=cfg)


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory) -> tuple[LLM, LLM]:
    """(fused, eager) LLMs on the same tiny checkpoint."""
    arch, overrides = VARIANTS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    _build(arch, path, **overrides)
    return _llm(path, True), _llm(path, False)


def _prompts(lengths: list[int], seed: int, vocab: int = 1024) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list:
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


@torch.inference_mode()
def _decode_step_logits(llm: LLM, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill the prompts (eager), then run the same decode step through the plan and through the eager
    model on a decode-only batch (its quantized layers on the same kernels): ([B, V], [B, V]). Each run
    writes its own keys/values for the new token before reading them."""
    runner = llm.runner
    seqs = [
        Sequence(f"s{i}", 0, list(p), SamplingParams(max_tokens=2), frozenset())
        for i, p in enumerate(prompts)
    ]
    place(llm.engine.cache, seqs, 1)
    plan = runner.decode_plan
    assert plan is not None
    try:
        step = runner.run(ScheduledBatch(seqs, [len(p) for p in prompts], 0))
        for seq, row in zip(seqs, step.sample, strict=True):
            seq.num_computed_tokens = seq.num_tokens
            seq.output_ids.append(int(row.argmax()))
        decode = ScheduledBatch(seqs, [1] * len(seqs), len(seqs))
        runs, restore = plan.num_runs, _states(runner)
        fused = runner.run(decode).sample.clone()
        assert plan.num_runs == runs + 1
        restore()  # the eager step starts from the same recurrent states
        runner.decode_plan = None
        eager = runner.run(decode).sample.clone()
    finally:
        runner.decode_plan = plan
        release(llm.engine.cache, seqs)
    return fused, eager


def _states(runner: ModelRunner) -> Callable[[], None]:
    """Snapshot the recurrent (Mamba2) states; the returned function puts them back (a decode step
    advances them in place, while attention only writes the new token's keys, the same each time)."""
    saved = [(t, t.clone()) for t in runner.cache.state]

    def restore() -> None:
        for t, copy in saved:
            t.copy_(copy)

    return restore


def test_batched_greedy_tokens_equal_eager(pair):
    fused, eager = pair
    plan = fused.runner.decode_plan
    assert plan is not None and eager.runner.decode_plan is None
    prompts = _prompts([3, 21, 8, 30], seed=3)  # up to 42 tokens: past Mistral's window of 24
    runs = plan.num_runs
    assert _tokens(fused, prompts, GREEDY) == _tokens(eager, prompts, GREEDY)
    assert plan.num_runs - runs >= GREEDY.max_tokens - 1  # every decode step went through the plan


def test_mixed_steps_run_their_decodes_through_the_plan(pair, monkeypatch):
    """Decodes never take the eager path (whose quantized layers compute differently), even in steps that
    also hold a prefill chunk: those run the plan for the decodes, then the eager model for the chunk."""
    fused, eager = pair
    runner, plan = fused.runner, fused.runner.decode_plan
    assert plan is not None
    eager_decodes: list[int] = []
    mixed = 0
    run_eager, run = runner._run_eager, runner.run

    def spy_eager(sched: ScheduledBatch):
        eager_decodes.append(sched.num_decodes)
        return run_eager(sched)

    def spy_run(sched: ScheduledBatch):
        nonlocal mixed
        runs, calls = plan.num_runs, len(eager_decodes)
        out = run(sched)
        mixed += plan.num_runs > runs and len(eager_decodes) > calls
        return out

    monkeypatch.setattr(runner, "_run_eager", spy_eager)
    monkeypatch.setattr(runner, "run", spy_run)
    prompts = _prompts([4, 40, 9, 33], seed=7)
    assert _tokens(fused, prompts, GREEDY) == _tokens(eager, prompts, GREEDY)
    assert mixed > 0 and eager_decodes and set(eager_decodes) == {0}


def test_decode_step_logits_equal_eager(pair):
    """The plan replays the eager model's own kernel calls: the same bits."""
    fused, _ = pair
    got, want = _decode_step_logits(fused, _prompts([5, 17, 40, 9], seed=4))
    assert torch.equal(got, want)


def test_batch_size_changes_as_sequences_finish(pair):
    fused, eager = pair
    prompts = _prompts([6, 19, 11, 27], seed=5)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 14, 7, 10)]
    together = _tokens(fused, prompts, params)
    alone = [_tokens(eager, [p], sp)[0] for p, sp in zip(prompts, params, strict=True)]
    assert together == alone
    assert {1, 2, 3, 4} <= set(fused.runner.decode_plan.batch_sizes)  # type: ignore[union-attr]


@torch.inference_mode()
def test_rows_do_not_depend_on_the_batch(pair):
    """Bit for bit: each sequence's decode logits alone == in a batch of four (one long enough for the
    attention kernel to split its keys)."""
    runner = pair[0].runner
    prompts = _prompts([9, 300, 40, 130], seed=8)
    seqs = [Sequence(f"s{i}", 0, p, SamplingParams(max_tokens=2), frozenset()) for i, p in enumerate(prompts)]
    place(pair[0].engine.cache, seqs, 1)
    for seq in seqs:
        runner.run(ScheduledBatch([seq], [seq.num_tokens], 0))
        seq.num_computed_tokens = seq.num_tokens
        seq.output_ids.append(1)
    restore = _states(runner)
    try:
        together = runner.run(ScheduledBatch(seqs, [1] * 4, 4)).sample.clone()
        for i, seq in enumerate(seqs):
            restore()  # recurrent states as before the step
            assert torch.equal(runner.run(ScheduledBatch([seq], [1], 1)).sample[0], together[i])
    finally:
        release(pair[0].engine.cache, seqs)


@pytest.mark.parametrize("kv", ["float16", "bfloat16"])
def test_16bit_kv_cache(tmp_path, kv):
    """A 16-bit K/V cache: the plan's kernels (write rounded, widen on read) and the eager model (casts on
    write and read, a prefill chunk attending to its own keys as stored) see the same values: one decode
    step's logits agree to fp32 precision and greedy tokens are identical, fused or eager."""
    _build("LlamaForCausalLM", tmp_path)
    cfg = EngineConfig(max_num_seqs=8, max_model_len=512, max_num_batched_tokens=16)
    fused = LLM(tmp_path, cpu=True, dtype="float32", engine_config=cfg, kv_cache_dtype=kv)
    eager_cfg = EngineConfig(max_num_seqs=8, max_model_len=512, max_num_batched_tokens=16, fused_decode=False)
    eager = LLM(tmp_path, cpu=True, dtype="float32", engine_config=eager_cfg, kv_cache_dtype=kv)
    assert fused.runner.cache.layer(0).k.dtype == getattr(torch, kv) and fused.runner.decode_plan is not None
    got, want = _decode_step_logits(fused, _prompts([5, 17, 40, 9], seed=4))
    assert torch.equal(got, want)
    prompts = _prompts([3, 21, 8, 30], seed=3)
    assert _tokens(fused, prompts, GREEDY) == _tokens(eager, prompts, GREEDY)


def test_kv_cache_dtype_choice(tmp_path):
    """auto: float16 with quantized or 16-bit weights on the CPU (as llama.cpp), else the model dtype."""
    from blazr.errors import BlazrError

    _build("LlamaForCausalLM", tmp_path)
    assert LLM(tmp_path, cpu=True, quantize="int8").kv_dtype == torch.float16
    assert LLM(tmp_path, cpu=True, quantize="bf16").kv_dtype == torch.float16
    assert LLM(tmp_path, cpu=True, quantize="none").kv_dtype == torch.float32
    assert LLM(tmp_path, cpu=True, quantize="int8", kv_cache_dtype="float32").kv_dtype == torch.float32
    with pytest.raises(BlazrError, match="unknown kv cache dtype 'fp8'"):
        LLM(tmp_path, cpu=True, kv_cache_dtype="fp8")


def _quantize_linears(model: CausalLM, kind: str) -> None:
    """Swap every float linear of the model (projections and lm head: nn.Linear, or the f32 QuantizedLinear
    a float model loads with) for a QuantizedLinear of `kind`."""
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) or (isinstance(m, QuantizedLinear) and m.kind == "f32"):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            bias = None if m.bias is None else m.bias.detach()
            setattr(parent, attr, QuantizedLinear(quantize(m.weight.detach(), kind), bias))


@pytest.mark.parametrize(
    "arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Mamba2ForCausalLM", "Qwen3_5ForCausalLM"]
)
def test_quantized_weights(tmp_path, arch):
    """Q8_0 linears (the lm head too): the plan replays the same block-quantized kernel calls as the eager
    model — the same bits, although the kernels quantize activations to 8 bits, which would turn any last-bit
    difference upstream into a visible one."""
    _build(arch, tmp_path, **OVERRIDES.get(arch, {}))
    llm = _llm(tmp_path, True)
    runner = llm.runner
    _quantize_linears(runner.model, "q8_0")
    runner.decode_plan = DecodePlan.create(
        runner.model, runner.cache, llm.engine_config, llm.device, llm.dtype
    )
    assert runner.decode_plan is not None
    kinds = {m.kind for m in runner.model.modules() if isinstance(m, QuantizedLinear)}
    assert kinds == {"q8_0"} and isinstance(runner.model.lm_head, QuantizedLinear)
    got, want = _decode_step_logits(llm, _prompts([7, 30, 12], seed=6))
    assert torch.equal(got, want)


def test_smollm2_decode_step():
    """The embedded SmolLM2 (30 layers, tied head) with float32 weights (`quantize="none"`; with its GGUF
    blocks kept, 8-bit activation rounding turns a 1e-6 input change into ~1 logit, see above)."""
    engine_cfg = EngineConfig(max_num_seqs=4, max_model_len=256)
    llm = LLM(cpu=True, dtype="float32", quantize="none", engine_config=engine_cfg)
    assert llm.runner.decode_plan is not None and llm.config.tie_word_embeddings
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": c}]) for c in ("Hi!", "Name a color.")]
    got, want = _decode_step_logits(llm, prompts)
    assert torch.equal(got, want)


# ------------------------------------------------------------------------------- what create refuses

ROPE = RopeConfig(dim=32)
ATTN = AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=32, rope=ROPE, softmax_scale=32**-0.5)
MLP = MLPConfig(intermediate_size=128)
MAMBA = Mamba2Config(num_heads=4, head_dim=32, state_size=16, n_groups=1, conv_kernel=4)
ATTN_LAYER = LayerConfig(mixers=(ATTN,), mlp=MLP)


MOE = MoEConfig(num_experts=4, top_k=2, expert=MLPConfig(intermediate_size=32))
MLA = MLAConfig(4, None, 32, 16, 8, 16, RopeConfig(dim=8), 0.1)
MLA_LORA = MLAConfig(4, 24, 32, 16, 8, 16, RopeConfig(dim=8), 0.1)
# DeepSeek-V3's routing (sigmoid + selection bias, top-two-sum groups, scaled) with a shared expert;
# NemotronH's ungated ReLU² experts.
MOE_V3 = MoEConfig(
    num_experts=8, top_k=2, expert=MLPConfig(intermediate_size=32), scoring="sigmoid",
    has_correction_bias=True, num_groups=4, topk_groups=2, group_score="top2_sum", routed_scaling_factor=2.5,
    shared=MLPConfig(intermediate_size=64),
)  # fmt: skip
MOE_RELU2 = MoEConfig(
    num_experts=4, top_k=2, expert=MLPConfig(intermediate_size=32, is_gated=False, activation="relu2")
)


def _create(cfg: ModelConfig, wrap: bool = True, **engine: object) -> DecodePlan | None:
    """A random model of `cfg`, its float linears (and MLA's per-head weights) on the kernels as the loader
    leaves them (`wrap`)."""
    engine_cfg = EngineConfig(**{"max_num_seqs": 2, "max_model_len": 128, **engine})  # type: ignore[arg-type]
    model = CausalLM(cfg).eval()
    if wrap:
        wrap_float_linears(model)
        absorb_mla(model, "none")
    cache = ModelCache(cache_layout(cfg), 256, 2, torch.float32)
    return DecodePlan.create(model, cache, engine_cfg, torch.device("cpu"), torch.float32)


def _cfg(*layers: LayerConfig, **changes: object) -> ModelConfig:
    cfg = ModelConfig("LlamaForCausalLM", 64, 64, layers, max_position_embeddings=128)
    return cfg.with_(**changes)


@pytest.mark.parametrize(
    "cfg",
    [
        _cfg(ATTN_LAYER, ATTN_LAYER),
        _cfg(LayerConfig(mixers=(MAMBA,), mlp=MLP), ATTN_LAYER, LayerConfig(mixers=(MAMBA,))),
        _cfg(LayerConfig(mixers=(AttentionConfig(4, 2, 32, None, 0.1),), mlp=MLP)),
        _cfg(ATTN_LAYER, residual_multiplier=0.5, embedding_multiplier=2.0, logits_scale=0.5),
        _cfg(LayerConfig(mixers=(ATTN, MAMBA), mlp=MLP)),  # FalconH1: two mixers side by side
        _cfg(LayerConfig(mixers=(ATTN,), mlp=MLPConfig(128, activation="gelu"))),
        _cfg(LayerConfig(mixers=(ATTN,), mlp=MLPConfig(128, is_gated=False, activation="relu2"))),
        _cfg(LayerConfig(mixers=(ATTN,), moe=MOE)),
        _cfg(LayerConfig(mixers=(MLA,), mlp=MLP)),
        _cfg(LayerConfig(mixers=(MLA_LORA,), moe=MOE_V3), LayerConfig(mixers=(MAMBA,), moe=MOE_RELU2)),
    ],
    ids=[
        "attention",
        "mamba-hybrid",
        "nope",
        "multipliers",
        "parallel-mixers",
        "gelu",
        "relu2",
        "moe",
        "mla",
        "mla-moe-groups",
    ],
)
def test_create_accepts(cfg):
    plan = _create(cfg)
    assert plan is not None and plan.batch_sizes == [1]


@pytest.mark.parametrize(
    "cfg, engine, why",
    [
        (_cfg(ATTN_LAYER), dict(fused_decode=False), None),
        (_cfg(LayerConfig(mixers=(MAMBA,), norm=NormConfig("layer"))), {}, "model/norm.py"),
        (_cfg(ATTN_LAYER), dict(max_model_len=4096), "rope table"),  # positions past the rope table
    ],
    ids=["fused-off", "layernorm", "rope-len"],
)
def test_create_refuses_and_says_why(cfg, engine, why, caplog):
    with caplog.at_level(logging.INFO, logger="blazr"):
        assert _create(cfg, **engine) is None
    if why is not None:
        assert why in caplog.text and "fused decode off" in caplog.text


def test_create_refuses_float_linears_off_the_kernels(caplog):
    """A model whose float linears were not wrapped (nn.Linear: torch's GEMM) cannot be replayed."""
    with caplog.at_level(logging.INFO, logger="blazr"):
        assert _create(_cfg(ATTN_LAYER), wrap=False) is None
    assert "aten.mm" in caplog.text or "aten.addmm" in caplog.text or "aten.linear" in caplog.text


def test_create_refuses_without_kernels(monkeypatch):
    monkeypatch.setenv("BLAZR_KERNELS", "0")
    ops.reset()
    try:
        assert _create(_cfg(ATTN_LAYER)) is None
    finally:
        monkeypatch.undo()
        ops.reset()
