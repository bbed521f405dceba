"""Sliding-window layers hold only their window (state/layout.py KV groups, engine/cache_manager.py): parity
with transformers for Mistral- and Qwen2-style models whose every layer slides (one KV group, no full one)
over sequences several windows long; a Gemma 3 sequence of 300 tokens whose sliding table never holds more
than its window's blocks while its full table holds them all (chunks longer than the window included), with
transformers' greedy tokens; the memory plan of the Gemma-3-1B shape at 8k and 32k context against full
attention; `blazr info`'s per-kind budgets."""

from __future__ import annotations

import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.config import AttentionConfig, EngineConfig, LayerConfig, ModelConfig
from blazr.engine.outputs import SeqOutput
from blazr.model.mixers import cache_layout
from blazr.state.allocator import DROPPED
from blazr.state.budget import plan_cache, window_blocks
from tests.hf_parity import ParityTests, prompts
from tests.ssm_fixtures import load_pair, randomise, single_thread
from tests.test_hf_gemma3 import SIZES as GEMMA3_SIZES
from tests.tiny import build, hf_greedy

WINDOW = 16
SLIDING = {
    "mistral": ("MistralForCausalLM", dict(sliding_window=WINDOW)),
    "qwen2": ("Qwen2ForCausalLM", dict(sliding_window=WINDOW, use_sliding_window=True, max_window_layers=0)),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(SLIDING))
def pair(request, tmp_path_factory):
    arch, overrides = SLIDING[request.param]
    got = load_pair(tmp_path_factory.mktemp(request.param), request.param, arch, **overrides)
    assert got.llm.runner.cache.layout.windows == (WINDOW,)  # one group, sliding
    return got


class TestEverySlidingLayer(ParityTests):
    """Logits, greedy tokens (43 positions), cache invariants (prompts of 70 tokens: 4 windows; chunks of 7
    and 64) and batched == alone against transformers, with every layer's table trimmed to its window."""


# --------------------------------------------------------------------------------- the window's blocks


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """Gemma 3 with 2 sliding layers (window 32) beside a full one; chunks of 64 tokens (> the window)."""
    path = tmp_path_factory.mktemp("gemma3-window")
    hf = build("Gemma3ForCausalLM", path, seed=3, **dict(GEMMA3_SIZES, sliding_window=32))
    randomise(hf, 4)
    hf.save_pretrained(path)
    cfg = EngineConfig(max_num_seqs=4, max_model_len=512, max_num_batched_tokens=64, cache_memory_gib=0.25)
    return hf, LLM(path, cpu=True, dtype="float32", engine_config=cfg), path


def test_sliding_table_holds_only_the_window(gemma3):
    """A 300-token prompt (5 chunks of 64) and 20 decodes: after every step the sliding group's table holds
    ≤ 3 blocks of 16 (window 32), the full group's every block, and the tokens equal transformers'."""
    hf, llm, _ = gemma3
    assert llm.runner.cache.layout.windows == (None, 32)
    prompt = prompts([300], seed=5, vocab=llm.config.vocab_size)[0]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm.engine.add_request("r", prompt, params)
    cache, out = llm.engine.cache, []
    held_max = 0
    while llm.engine.has_unfinished():
        outs: list[SeqOutput] = llm.engine.step()
        out += [t for o in outs for t in o.token_ids]
        for seq in llm.engine.scheduler.running:
            full, sliding = seq.block_tables
            held = [b for b in sliding if b != DROPPED]
            held_max = max(held_max, len(held))
            assert len(held) <= 3, (seq.num_computed_tokens, sliding)
            assert DROPPED not in full and len(full) == -(-seq.num_computed_tokens // 16)
    assert held_max == 3
    assert cache.pools[1].usage == 0.0 and cache.pools[0].usage == 0.0  # all released
    assert out == hf_greedy(hf, prompt, 20)


def test_prefix_hit_needs_the_window_blocks_held(gemma3):
    """A repeat hits while the sliding pool still holds the prompt's last window; once those blocks are
    reused (the pool is small), the full group alone cannot serve a hit and nothing is cached."""
    _, llm, _ = gemma3
    prompt = prompts([120], seed=6, vocab=llm.config.vocab_size)[0]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    first = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params)[0]
    assert again.num_cached_tokens == 112 and again.outputs[0].token_ids == first.outputs[0].token_ids
    sliding = llm.engine.cache.pools[1]
    sliding.allocate(sliding.num_free)  # every free block reused: the cached window is gone
    sliding.free(list(range(sliding.num_blocks)))
    assert llm.engine.cache.pools[0].num_cached > 0  # the full group's blocks are still named
    third = llm.generate([prompt], params)[0]
    assert third.num_cached_tokens == 0 and third.outputs[0].token_ids == first.outputs[0].token_ids


# ----------------------------------------------------------------------------------- the memory plan


def gemma3_1b() -> ModelConfig:
    """The Gemma-3-1B cache shape: 26 layers, 1 KV head of 256, window 512, every 6th layer full."""

    def attention(i: int) -> AttentionConfig:
        window = None if (i + 1) % 6 == 0 else 512
        return AttentionConfig(4, 1, 256, None, 256**-0.5, sliding_window=window)

    layers = tuple(LayerConfig(mixers=(attention(i),)) for i in range(26))
    return ModelConfig(architecture="Gemma3ForCausalLM", vocab_size=262144, hidden_size=1152, layers=layers)


@pytest.mark.parametrize("context", [8192, 32768])
def test_gemma3_1b_plan_is_a_fifth_of_full_attention_at_32k(context):
    """KV bytes of one sequence at `context` (bf16): 4 full layers hold every position, 22 sliding layers
    hold W + 2 blocks + a chunk (512 + 32 + 512 tokens) — (4 + 22·w) / 26 of full attention, w the sliding
    share; at 32k under a fifth."""
    engine = EngineConfig(max_num_seqs=1, max_model_len=context, cache_memory_gib=4.0)
    cfg = gemma3_1b()
    layout = cache_layout(cfg)
    assert layout.windows == (None, 512) and layout.group_num_layers() == (4, 22)
    plan = plan_cache(layout, engine, torch.bfloat16)
    per_layer_token = 2 * 256 * 2  # K and V, one head of 256, bf16
    sliding_tokens = (window_blocks(512, engine) + 1) * 16  # + the padding block
    assert sliding_tokens == 512 + 16 + 512 + 32
    full_tokens = context + 16
    assert plan.group_bytes == (4 * full_tokens * per_layer_token, 22 * sliding_tokens * per_layer_token)
    full = plan_cache(cache_layout(_without_windows(cfg)), engine, torch.bfloat16)
    assert full.kv_bytes == 26 * full_tokens * per_layer_token
    ratio = plan.kv_bytes / full.kv_bytes
    assert ratio == pytest.approx((4 + 22 * sliding_tokens / full_tokens) / 26)
    if context == 32768:
        assert ratio < 0.2


def _without_windows(cfg: ModelConfig) -> ModelConfig:
    from dataclasses import replace

    layers = tuple(
        replace(layer, mixers=tuple(replace(m, sliding_window=None) for m in layer.mixers))
        for layer in cfg.layers
    )
    return replace(cfg, layers=layers)


def test_sliding_pool_sizes_for_the_running_windows():
    """max_num_seqs × (⌈W/16⌉ + 2 + ⌈chunk/16⌉) blocks, never more than every sequence at full length, and a
    forced num_kv_blocks caps it."""
    engine = EngineConfig(max_num_seqs=8, max_model_len=4096, max_num_batched_tokens=256)
    assert window_blocks(512, engine) == 8 * (32 + 2 + 16)
    assert window_blocks(100_000, engine) == 8 * 4096 // 16
    layout = cache_layout(gemma3_1b())
    forced = plan_cache(
        layout, EngineConfig(max_num_seqs=8, max_model_len=4096, num_kv_blocks=40), torch.bfloat16
    )
    assert forced.group_blocks == (40, 40)


def test_info_shows_the_budget_per_layer_kind(gemma3):
    """`blazr info`'s cache.groups: the full group's and the sliding group's layers, bytes per token and
    pool (at the same limits the sliding pool is the windows' size, the full one every sequence's length)."""
    from blazr.detect import inspect_checkpoint
    from blazr.info import describe

    engine = EngineConfig(max_num_seqs=4, max_model_len=512, max_num_batched_tokens=64, cache_memory_gib=0.25)
    groups = describe(inspect_checkpoint(gemma3[2]), engine=engine)["cache"]["groups"]
    assert [(g["kind"], g["window"], g["layers"]) for g in groups] == [
        ("full", None, 1),
        ("sliding-32", 32, 2),
    ]
    per_layer = 2 * 2 * 16 * 4  # K and V × kv heads × head_dim × fp32
    assert [g["kv_bytes_per_token"] for g in groups] == [per_layer, 2 * per_layer]
    assert groups[0]["tokens"] == 4 * 512 and groups[1]["tokens"] == 4 * (2 + 2 + 4) * 16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropped_positions_never_read_garbage(tmp_path_factory, dtype):
    """Pools filled with NaN (CPU pools are uninitialised): a sliding group's dropped positions point at a
    written slot, so every schedule gives the logits of zero-filled pools, bit for bit — bfloat16 through
    torch attention over the padded, masked kv_indices, float32 through the C decode kernel. Blocks of 4
    and a window of 8, so tables drop blocks within these short prompts."""
    from tests.test_load_memory import _check_nan_pools

    path = tmp_path_factory.mktemp(f"gemma3-nan-{dtype}")
    hf = build("Gemma3ForCausalLM", path, seed=1, **dict(GEMMA3_SIZES, sliding_window=8))
    randomise(hf, 2)
    hf.save_pretrained(path)
    engine = EngineConfig(max_num_seqs=4, max_model_len=256, block_size=4, cache_memory_gib=0.05)
    _check_nan_pools(lambda: LLM(path, cpu=True, dtype=dtype, engine_config=engine), hf.config.vocab_size)
