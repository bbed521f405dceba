"""The fused CPU decode step (engine/decode_plan.py) against the eager model: greedy tokens of batched
generation identical with and without the plan (Llama, Qwen2 with q/k/v bias, Mistral with a sliding window
shorter than the sequences), batch sizes changing as sequences finish, one decode step's logits close
(float and Q8_0 weights), and `create` refusing what the kernels do not cover."""

from __future__ import annotations

import random
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
    MLPConfig,
    ModelConfig,
    RopeConfig,
)
from blazr.engine.decode_plan import DecodePlan
from blazr.engine.runner import ModelRunner
from blazr.engine.scheduler import ScheduledBatch
from blazr.engine.sequence import Sequence
from blazr.kernels import ops
from blazr.kernels.build import available
from blazr.kernels.quant import quantize
from blazr.model.model import CausalLM
from blazr.model.qlinear import QuantizedLinear, use_kernels
from blazr.state.kv_cache import ModelCache
from tests.drive import assert_logits_close
from tests.tiny import build


def test_kernel_library_is_available() -> None:
    assert available(), "the C kernel library is unavailable (no C compiler, or BLAZR_KERNELS=0)"


VARIANTS = {
    "llama": ("LlamaForCausalLM", {}),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "mistral-window": ("MistralForCausalLM", dict(sliding_window=24)),
}
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _build(arch: str, path: Path, **overrides: object) -> None:
    """A tiny checkpoint; q/k/v biases (zero-initialised by transformers) made random so that they count."""
    hf = build(arch, path, **overrides)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.normal_(0, 0.5)
    hf.save_pretrained(path)


def _llm(path: Path, fused: bool) -> LLM:
    # A small token budget chunks the prompts, so most steps mix decodes with a prefill chunk.
    cfg = EngineConfig(max_num_seqs=8, max_model_len=512, max_num_batched_tokens=16, fused_decode=fused)
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
def _decode_step_logits(runner: ModelRunner, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill the prompts (eager), then run the same decode step through the plan and through the eager
    model, its quantized layers on the same kernels (`use_kernels`): ([B, V], [B, V]). Each run writes its
    own keys/values for the new token before reading them."""
    seqs = [
        Sequence(f"s{i}", 0, list(p), SamplingParams(max_tokens=2), frozenset())
        for i, p in enumerate(prompts)
    ]
    assert runner.blocks is not None
    for seq in seqs:
        seq.block_table = runner.blocks.allocate(runner.blocks.blocks_needed(seq.num_tokens + 1, 0))
    plan = runner.decode_plan
    assert plan is not None
    try:
        step = runner.run(ScheduledBatch(seqs, [len(p) for p in prompts], 0))
        for seq, row in zip(seqs, step.sample, strict=True):
            seq.num_computed_tokens = seq.num_tokens
            seq.output_ids.append(int(row.argmax()))
        decode = ScheduledBatch(seqs, [1] * len(seqs), len(seqs))
        runs = plan.num_runs
        fused = runner.run(decode).sample.clone()
        assert plan.num_runs == runs + 1
        runner.decode_plan = None
        with use_kernels():
            eager = runner.run(decode).sample.clone()
    finally:
        runner.decode_plan = plan
        for seq in seqs:
            runner.blocks.free(seq.block_table)
    return fused, eager


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


def test_decode_step_logits_match_eager(pair):
    fused, _ = pair
    got, want = _decode_step_logits(fused.runner, _prompts([5, 17, 40, 9], seed=4))
    for g, w in zip(got, want, strict=True):
        assert_logits_close(g, w, rel=1e-4)


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
    assert runner.blocks is not None
    for seq in seqs:
        seq.block_table = runner.blocks.allocate(runner.blocks.blocks_needed(seq.num_tokens + 1, 0))
        runner.run(ScheduledBatch([seq], [seq.num_tokens], 0))
        seq.num_computed_tokens = seq.num_tokens
        seq.output_ids.append(1)
    try:
        together = runner.run(ScheduledBatch(seqs, [1] * 4, 4)).sample.clone()
        for i, seq in enumerate(seqs):
            assert torch.equal(runner.run(ScheduledBatch([seq], [1], 1)).sample[0], together[i])
    finally:
        for seq in seqs:
            runner.blocks.free(seq.block_table)


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
    got, want = _decode_step_logits(fused.runner, _prompts([5, 17, 40, 9], seed=4))
    for g, w in zip(got, want, strict=True):
        assert_logits_close(g, w, rel=1e-4)
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
        if type(m) is nn.Linear or (isinstance(m, QuantizedLinear) and m.kind == "f32"):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            bias = None if m.bias is None else m.bias.detach()
            setattr(parent, attr, QuantizedLinear(quantize(m.weight.detach(), kind), bias))


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_quantized_weights(tmp_path, arch):
    """Q8_0 linears through the plan and through QuantizedLinear run the same linear kernels, but the
    kernels quantize activations to 8 bits per block of 32, so a last-bit difference elsewhere (torch vs
    kernel RMSNorm / RoPE / attention / SiLU) can flip one rounding: an error up to amax/254 of a block
    (measured: ~1e-6 × scale mostly, 5e-3 × scale for one seed in twelve). The tolerance covers a flip; a
    real fault (a dropped bias, a wrong rotation) is off by the whole logit scale."""
    _build(arch, tmp_path)
    llm = _llm(tmp_path, True)
    runner = llm.runner
    _quantize_linears(runner.model, "q8_0")
    runner.decode_plan = DecodePlan.create(
        runner.model, runner.cache, llm.engine_config, llm.device, llm.dtype
    )
    assert runner.decode_plan is not None
    assert runner.decode_plan.lm_head.weight.kind == "q8_0"
    assert runner.decode_plan.layers[0].qkv.weight.kind == "q8_0"
    got, want = _decode_step_logits(runner, _prompts([7, 30, 12], seed=6))
    for g, w in zip(got, want, strict=True):
        assert_logits_close(g, w, rel=2e-2)


def test_smollm2_decode_step():
    """The embedded SmolLM2 (30 layers, tied head) with float32 weights (`quantize="none"`; with its GGUF
    blocks kept, 8-bit activation rounding turns a 1e-6 input change into ~1 logit, see above)."""
    engine_cfg = EngineConfig(max_num_seqs=4, max_model_len=256)
    llm = LLM(cpu=True, dtype="float32", quantize="none", engine_config=engine_cfg)
    assert llm.runner.decode_plan is not None and llm.config.tie_word_embeddings
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": c}]) for c in ("Hi!", "Name a color.")]
    got, want = _decode_step_logits(llm.runner, prompts)
    for g, w in zip(got, want, strict=True):
        assert_logits_close(g, w, rel=1e-4)


# ------------------------------------------------------------------------------- what create refuses

ROPE = RopeConfig(dim=32)
ATTN = AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=32, rope=ROPE, softmax_scale=32**-0.5)
MLP = MLPConfig(intermediate_size=128)
MAMBA = Mamba2Config(num_heads=4, head_dim=32, state_size=16, n_groups=1, conv_kernel=4)
ATTN_LAYER = LayerConfig(attention=ATTN, mlp=MLP)


def _create(cfg: ModelConfig, **engine: object) -> DecodePlan | None:
    engine_cfg = EngineConfig(**{"max_num_seqs": 2, "max_model_len": 128, **engine})  # type: ignore[arg-type]
    model = CausalLM(cfg).eval()
    cache = ModelCache(cfg, 256, 2, torch.float32)
    return DecodePlan.create(model, cache, engine_cfg, torch.device("cpu"), torch.float32)


def _cfg(*layers: LayerConfig, **changes: object) -> ModelConfig:
    cfg = ModelConfig("LlamaForCausalLM", 64, 64, layers, max_position_embeddings=128)
    return cfg.with_(**changes)


def test_create_accepts_a_pure_attention_model():
    plan = _create(_cfg(ATTN_LAYER, ATTN_LAYER))
    assert plan is not None and plan.batch_sizes == [1]


@pytest.mark.parametrize(
    "cfg, engine",
    [
        (_cfg(ATTN_LAYER), dict(fused_decode=False)),
        (_cfg(LayerConfig(mamba=MAMBA, mlp=MLP), ATTN_LAYER), {}),  # hybrid
        (_cfg(LayerConfig(attention=ATTN, mlp=MLPConfig(128, activation="gelu"))), {}),
        (_cfg(LayerConfig(attention=ATTN, mlp=MLPConfig(128, is_gated=False, activation="relu2"))), {}),
        (_cfg(LayerConfig(attention=AttentionConfig(4, 2, 32, None, 0.1), mlp=MLP)), {}),  # NoPE
        (_cfg(ATTN_LAYER, residual_multiplier=0.5), {}),
        (_cfg(ATTN_LAYER, logits_scale=0.5), {}),
        (_cfg(ATTN_LAYER), dict(max_model_len=4096)),  # positions past the rope table
    ],
    ids=["fused-off", "mamba-hybrid", "gelu", "ungated", "nope", "residual-mult", "logits-scale", "rope-len"],
)
def test_create_refuses(cfg, engine):
    assert _create(cfg, **engine) is None


def test_create_refuses_without_kernels(monkeypatch):
    monkeypatch.setenv("BLAZR_KERNELS", "0")
    ops.reset()
    try:
        assert _create(_cfg(ATTN_LAYER)) is None
    finally:
        monkeypatch.undo()
        ops.reset()
