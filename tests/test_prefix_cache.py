"""Prefix caching (engine/cache_manager.py): cache on == cache off, token for token and logprobs within float
tolerance, for every kind of cache — paged attention (Llama), MLA + MoE (DeepSeek-V3), recurrent state only
(Mamba2) and both (GraniteMoeHybrid: Mamba2 + attention; Qwen3.5: gated DeltaNet + gated attention;
Kimi-Linear: KDA + MLA) — over
the cases that exercise it: an exact repeat,
a shared prefix ending mid-block and exactly on a block boundary, a prompt that is a prefix of a cached one,
the next turn of a conversation, concurrent requests sharing a prefix, eviction under memory pressure,
preemption, n > 1 and prompt logprobs. Each case also checks how many tokens were served from the
cache, so a cache that silently misses fails too.
The short-conv and Mamba1 families run the same cases (LFM2: short conv + attention), and sliding-window
attention whose KV groups hold only the window (Gemma 3: 2 sliding layers of window 32 beside a full one;
Mistral: every layer sliding, so no full group at all) — prompts of 100+ tokens, several windows long.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.config import EngineConfig
from blazr.engine.outputs import SeqOutput
from tests.ssm_fixtures import HEADS, randomise, single_thread
from tests.test_hf_deepseek import MLA_SIZES, MOE_SIZES
from tests.test_hf_gemma3 import SIZES as GEMMA3_SIZES
from tests.test_hf_gemma4 import SIZES as GEMMA4_SIZES
from tests.test_hf_kimi_linear import SIZES as KIMI_SIZES
from tests.test_hf_qwen3_next import SIZES as QWEN_SIZES
from tests.test_hf_zamba2 import VARIANTS as ZAMBA2_SIZES
from tests.tiny import build

BS = 16  # block size
INTERVAL = 2  # state snapshots every 2 blocks (32 tokens), besides the prompt's last and the newest
MAMBA = dict(mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16, mamba_chunk_size=8, mamba_expand=2)
ARCHS = {
    "llama": ("LlamaForCausalLM", {}),
    "deepseek-mla-moe": ("DeepseekV3ForCausalLM", dict(MLA_SIZES, **MOE_SIZES, q_lora_rank=48, n_group=2,
                                                       topk_group=1)),
    "mamba2": ("Mamba2ForCausalLM", dict(num_heads=16, head_dim=16, state_size=16, chunk_size=8, expand=2,
                                         n_groups=2, num_hidden_layers=2)),
    "granite-hybrid": ("GraniteMoeHybridForCausalLM", dict(
        MAMBA, **HEADS, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], mamba_n_groups=1,
        num_local_experts=0, shared_intermediate_size=96)),
    "qwen3_5": ("Qwen3_5ForCausalLM", dict(QWEN_SIZES, num_hidden_layers=4)),  # gated DeltaNet + attention
    "lfm2": ("Lfm2ForCausalLM", dict(HEADS, num_hidden_layers=3,
                                     layer_types=["conv", "full_attention", "conv"])),
    "falcon-mamba": ("FalconMambaForCausalLM", dict(num_hidden_layers=2, state_size=16, time_step_rank=8)),
    "jamba": ("JambaForCausalLM", dict(HEADS, num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=1,
                                       num_experts=4, intermediate_size=96, mamba_dt_rank=8)),
    "kimi-linear": ("KimiLinearForCausalLM", KIMI_SIZES),  # KDA (channel-wise decay) + NoPE MLA + MoE
    "gemma3-window": ("Gemma3ForCausalLM", dict(GEMMA3_SIZES, sliding_window=32)),  # sliding + full groups
    "mistral-window": ("MistralForCausalLM", dict(sliding_window=32)),  # one group, sliding
    # shared blocks' calls on concat(x, embeddings), each call its own KV, beside Mamba2 states
    "zamba2": ("Zamba2ForCausalLM", ZAMBA2_SIZES["two-blocks"]),
    # KV shared across layers, K = V full layers, per-layer inputs, sliding + full groups
    "gemma4": ("Gemma4ForCausalLM", dict(GEMMA4_SIZES, sliding_window=32)),
}  # fmt: skip
HAS_STATE = {"llama": False, "deepseek-mla-moe": False, "mamba2": True, "granite-hybrid": True,
             "qwen3_5": True, "lfm2": True, "falcon-mamba": True, "jamba": True,
             "kimi-linear": True, "gemma3-window": False, "mistral-window": False, "zamba2": True,
             "gemma4": False}  # fmt: skip
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2, ignore_eos=True)


@dataclass
class Result:
    token_ids: list[list[int]] = field(default_factory=list)  # per sample
    logprobs: list[list[float]] = field(default_factory=list)
    prompt_logprobs: list[float | None] | None = None
    num_cached_tokens: int = 0


Params = SamplingParams | list[SamplingParams]


def run(llm: LLM, prompts: list[list[int]], params: Params = GREEDY) -> list[Result]:
    """All prompts submitted at once (with one SamplingParams each, or one for all), the engine stepped
    until done (SeqOutputs carry the cached count)."""
    ids = [uuid.uuid4().hex for _ in prompts]
    each = params if isinstance(params, list) else [params] * len(prompts)
    results = {rid: Result([[] for _ in range(q.n)], [[] for _ in range(q.n)])
               for rid, q in zip(ids, each, strict=True)}  # fmt: skip
    for rid, p, q in zip(ids, prompts, each, strict=True):
        llm.engine.add_request(rid, p, q)
    while llm.engine.has_unfinished():
        for out in llm.engine.step():
            _collect(results[out.request_id], out)
    return [results[rid] for rid in ids]


def _collect(res: Result, out: SeqOutput) -> None:
    res.token_ids[out.index] += out.token_ids
    res.logprobs[out.index] += [lp.logprob for lp in out.logprobs]
    res.num_cached_tokens = out.num_cached_tokens
    if out.prompt_logprobs is not None:
        res.prompt_logprobs = [None if lp is None else lp.logprob for lp in out.prompt_logprobs]


def assert_same(on: list[Result], off: list[Result]) -> None:
    for a, b in zip(on, off, strict=True):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-4), (x, y)
        if b.prompt_logprobs is not None:
            assert a.prompt_logprobs is not None and len(a.prompt_logprobs) == len(b.prompt_logprobs)
            assert a.prompt_logprobs[0] is None and b.prompt_logprobs[0] is None
            x, y = torch.tensor(a.prompt_logprobs[1:]), torch.tensor(b.prompt_logprobs[1:])
            assert torch.allclose(x, y, atol=1e-4)
        assert b.num_cached_tokens == 0


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 1000) for _ in range(n)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    paths = {}
    for name, (arch, overrides) in ARCHS.items():
        path = paths[name] = tmp_path_factory.mktemp(name)
        hf = build(arch, path, seed=3, **overrides)
        randomise(hf, 4)
        hf.save_pretrained(path)
    return paths


def load(path: Path, is_cached: bool = True, **engine: int) -> LLM:
    cfg = EngineConfig(
        max_num_seqs=8, max_model_len=512, block_size=BS, enable_prefix_caching=is_cached,
        state_snapshot_interval=INTERVAL, cache_memory_gib=0.25, **engine,
    )  # fmt: skip
    return LLM(path, cpu=True, dtype="float32", engine_config=cfg)


@pytest.fixture(scope="module", params=list(ARCHS))
def pair(request, checkpoints) -> tuple[str, LLM, LLM]:
    """(name, cache on, cache off) — the same checkpoint, one engine each for the whole module."""
    path = checkpoints[request.param]
    return request.param, load(path), load(path, False)


def both(pair, prompts: list[list[int]], params: Params = GREEDY) -> list[Result]:
    """Run on both engines, assert equal outputs; the cache-on results (for their cached counts)."""
    _, on, off = pair
    got = run(on, prompts, params)
    assert_same(got, run(off, prompts, params))
    return got


def deepest(n: int) -> int:
    """The deepest cached prefix a prompt of n tokens can use: full blocks, at least one token left."""
    return (n - 1) // BS * BS


# --------------------------------------------------------------------------------------------- cases


def test_exact_repeat(pair):
    p = tokens(100, seed=1)
    assert both(pair, [p])[0].num_cached_tokens == 0
    assert both(pair, [p])[0].num_cached_tokens == deepest(100)  # 96: the prompt's last boundary


def test_repeat_of_a_block_aligned_prompt(pair):
    """A prompt of exactly 4 blocks: a repeat must leave its last token to compute, so it resumes one block
    back (for recurrent state too: the prompt's last boundary before its end is always kept)."""
    p = tokens(64, seed=2)
    both(pair, [p])
    assert both(pair, [p])[0].num_cached_tokens == 48


def test_shared_prefix_ending_mid_block(pair):
    name = pair[0]
    shared = tokens(75, seed=3)
    both(pair, [shared + tokens(30, seed=4)])
    got = both(pair, [shared + tokens(20, seed=5)])[0].num_cached_tokens
    # attention: every full block of the shared 75 tokens (64); recurrent state: the deepest kept
    # boundary at or below it — every INTERVAL-th block (64 is one) — so also 64
    assert got == 64, name


def test_shared_prefix_ending_on_a_block_boundary(pair):
    name = pair[0]
    shared = tokens(80, seed=6)  # 5 blocks
    both(pair, [shared + tokens(40, seed=7)])
    got = both(pair, [shared + tokens(9, seed=8)])[0].num_cached_tokens
    # attention: all 5 shared blocks; recurrent: 80 is neither an even block nor the first prompt's last
    # boundary (112), so the deepest kept boundary is 64
    assert got == (64 if HAS_STATE[name] else 80), name


def test_prompt_that_is_a_prefix_of_a_cached_one(pair):
    long = tokens(150, seed=9)
    both(pair, [long])
    assert both(pair, [long[:70]])[0].num_cached_tokens == 64
    assert both(pair, [long[:33]])[0].num_cached_tokens == 32


def test_next_turn_of_a_conversation(pair):
    """Turn 2 = turn 1's prompt + its reply + a new message: it resumes inside turn 1's reply (for
    recurrent state from the newest boundary turn 1 reached while decoding — its rolling snapshot)."""
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=1, ignore_eos=True)
    turn1 = tokens(60, seed=10)
    reply = both(pair, [turn1], params)[0].token_ids[0]
    turn2 = turn1 + reply + tokens(15, seed=11)
    # turn 1 computed 60 + 23 tokens (its last sampled token was never fed back): 5 full blocks, and 80 is
    # an odd block boundary, kept only as turn 1's newest
    assert both(pair, [turn2], params)[0].num_cached_tokens == 80


def test_concurrent_requests_sharing_a_prefix(pair):
    """Several requests with one system prompt, submitted together (none can hit the others' blocks in
    their first step), then a second wave that hits what the first computed."""
    system = tokens(90, seed=12)
    first = both(pair, [system + tokens(n, seed=13 + n) for n in (5, 17, 33)])
    assert [r.num_cached_tokens for r in first] == [0, 0, 0]
    second = both(pair, [system + tokens(n, seed=20 + n) for n in (3, 40)] + [tokens(50, seed=130)])
    # 5 full blocks of the system prompt; for recurrent state 80 is the first request's last prompt boundary
    assert [r.num_cached_tokens for r in second] == [80, 80, 0]


def test_n_samples_with_a_hit(pair):
    p = tokens(70, seed=40)
    both(pair, [p])
    params = SamplingParams(n=3, max_tokens=5, temperature=0.8, seed=7, logprobs=1, ignore_eos=True)
    got = both(pair, [p], params)[0]
    assert got.num_cached_tokens == 64 and len({tuple(t) for t in got.token_ids}) > 1


def test_prompt_logprobs_are_never_dropped_by_a_hit(pair):
    """A request asking for prompt logprobs computes every prompt position (no lookup), so they are all
    there; its blocks still serve the next request."""
    p = tokens(50, seed=41)
    both(pair, [p])
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2, ignore_eos=True)
    got = both(pair, [p], params)[0]
    assert got.num_cached_tokens == 0 and got.prompt_logprobs is not None and len(got.prompt_logprobs) == 50
    assert both(pair, [p])[0].num_cached_tokens == 48


# ------------------------------------------------------------------------------- memory pressure


@pytest.fixture(scope="module")
def small(checkpoints) -> dict[str, tuple[str, LLM, LLM]]:
    """Engines with room for little: 12 blocks of 16 tokens and 3 state snapshots (cache on), for eviction
    and preemption; the cache-off twin has the same blocks."""
    loaded: dict[str, tuple[str, LLM, LLM]] = {}
    for name, path in checkpoints.items():
        on = load(path, num_kv_blocks=12, num_state_snapshots=3, max_num_batched_tokens=64)
        off = load(path, False, num_kv_blocks=12, max_num_batched_tokens=64)
        loaded[name] = (name, on, off)
    return loaded


@pytest.mark.parametrize("name", list(ARCHS))
def test_eviction_under_memory_pressure(small, name):
    """More distinct prompts than the cache holds: the oldest blocks and snapshots are reused for new ones,
    and a repeat afterwards is computed right whether its prefix survived or not."""
    pair = small[name]
    prompts = [tokens(70, seed=50 + i) for i in range(5)]  # 5 blocks each: the pool holds two
    for p in prompts:
        both(pair, [p])
    late, early = both(pair, [prompts[-1]]), both(pair, [prompts[0]])
    assert late[0].num_cached_tokens == 64  # the newest survived
    assert early[0].num_cached_tokens == 0  # the oldest was evicted
    cache = pair[1].engine.cache
    if cache.snapshots is not None:
        assert cache.num_snapshots <= 3


@pytest.mark.parametrize("name", list(ARCHS))
def test_preemption(small, name):
    """Four requests that cannot all fit (12 blocks): the newest are preempted and recomputed — from what
    is still cached — with the same tokens as without the cache."""
    pair = small[name]
    shared = tokens(40, seed=60)
    params = SamplingParams(max_tokens=30, temperature=0.0, logprobs=1, ignore_eos=True)
    both(pair, [shared + tokens(8, seed=61)], params)
    scheduler = pair[1].engine.scheduler
    before = scheduler.num_preemptions
    got = both(pair, [shared + tokens(10 + i, seed=62 + i) for i in range(4)], params)
    assert [r.num_cached_tokens for r in got] == [32] * 4
    cache = pair[1].engine.cache
    if cache.pools and all(p.window is not None for p in cache.pools):
        # every layer sliding (window 32): four sequences' windows fit in 12 blocks — nothing to preempt
        assert scheduler.num_preemptions == before
    elif cache.blocks is not None:  # (a Mamba2-only model holds no blocks)
        assert scheduler.num_preemptions > before


@pytest.mark.parametrize("name", ["llama", "granite-hybrid"])
def test_prompt_logprobs_of_a_sequence_preempted_mid_prefill(small, name):
    """B is preempted after its first prompt chunk was scored; recomputed later, it scores its prompt
    again from the start — each prompt token exactly once (and nothing is looked up: it needs them all)."""
    pair = small[name]
    scheduler = pair[1].engine.scheduler
    before = scheduler.num_preemptions
    params = [
        SamplingParams(max_tokens=20, temperature=0.0, prompt_logprobs=1, ignore_eos=True),
        SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=1, ignore_eos=True),
    ]
    got = both(pair, [tokens(100, seed=70), tokens(150, seed=71)], params)
    assert scheduler.num_preemptions > before
    assert [len(r.prompt_logprobs or []) for r in got] == [100, 150]


@pytest.mark.parametrize(
    "name, reference",
    [("granite-hybrid", "mamba2_prefill_reference"), ("qwen3_5", "deltanet_prefill_reference")],
)
def test_snapshots_inside_a_chunk_stay_on_the_kernel_scan(checkpoints, monkeypatch, name, reference):
    """A prefill cut at snapshot points runs the C kernel (Mamba2's scan segment by segment, DeltaNet's with
    its chunks cut there), never the torch reference (Mamba2's did once: the segments were gathered into two
    buffers the kernel refuses, and the fallback was silent — 20x slower)."""
    from blazr.kernels import ops_recurrent  # where mamba2_prefill / deltanet_prefill find their references
    from blazr.kernels.build import available

    if not available():
        pytest.fail("the C kernels did not build")
    llm = load(checkpoints[name])

    def refuse(*args, **kwargs):
        raise AssertionError(f"{reference} ran: the kernel was not taken")

    monkeypatch.setattr(ops_recurrent, reference, refuse)
    got = run(llm, [tokens(150, seed=80)])[0]  # saves at 32, 64, 96, 128 and 144: cuts inside the chunk
    assert len(got.token_ids[0]) == GREEDY.max_tokens and llm.engine.cache.num_snapshots >= 4


@pytest.mark.parametrize(
    ("name", "fallback"),
    [
        ("lfm2", "causal_conv_prefill_reference"),
        ("jamba", "causal_conv_prefill_reference"),
        ("jamba", "mamba1_scan_prefill_parallel"),  # Mamba1's fallback: the log-depth scan (parallel_scan.py)
    ],
)
def test_snapshots_inside_a_chunk_stay_on_the_kernels(checkpoints, monkeypatch, name, fallback):
    """The short conv's and Mamba1's prefills cut at snapshot points run their C kernels segment by
    segment, never the torch fallbacks."""
    from blazr.kernels import ops_recurrent  # where the conv / Mamba1 prefills find their fallbacks

    def refuse(*args, **kwargs):
        raise AssertionError(f"{fallback} ran: the kernel was not taken")

    monkeypatch.setattr(ops_recurrent, fallback, refuse)
    llm = load(checkpoints[name])
    got = run(llm, [tokens(150, seed=80)])[0]
    assert len(got.token_ids[0]) == GREEDY.max_tokens and llm.engine.cache.num_snapshots >= 4
