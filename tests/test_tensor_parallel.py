"""Tensor / expert parallelism on torch.distributed (gloo, 2 ranks on this machine): for a tiny random
checkpoint of every family — Llama, Mixtral (expert parallel), DeepSeek V2 / V3 (MLA + MoE), Mamba2 (groups
split and one group: its norm spans the ranks), GraniteMoeHybrid, NemotronH (and its latent MoE), FalconH1,
Qwen3.5 and Qwen3-Next (gated DeltaNet by key heads, gated attention), GLM-4.5 (per-head q/k norm, partial
rope, grouped sigmoid routing, shared expert), Phi-4-mini (fused qkv and gate_up, LongRoPE), Qwen3 and
Qwen3-MoE, Gemma 2 / 3 / 4 (Gemma 4's shared KV, K = V, per-layer inputs, MLP and MoE side by side), GPT-OSS,
Granite 3, SmolLM3, OLMo 2 / 3 (q/k norms over all heads: the mean of squares all-reduced) — the 2-rank
engine gives the 1-rank engine's greedy tokens and its logprobs (prompt and output, top 5 at every position)
within float32 rounding; the per-rank config and slices are checked on their own; and a 2-rank server answers
like a 1-rank one through the openai client."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.config import AttentionConfig, LayerConfig, Mamba2Config, ModelConfig
from blazr.detect import inspect_checkpoint
from blazr.distributed import ranks
from blazr.distributed.shard import padded_vocab, shard_config, slice_tensor
from blazr.distributed.worker import free_port
from blazr.engine.failures import EngineBrokenError
from blazr.engine.runner import TensorParallelStepError
from blazr.errors import BlazrError, UnsupportedError
from tests.server_util import ServerProcess
from tests.ssm_fixtures import randomise
from tests.test_hf_deepseek import MLA_SIZES, MOE_SIZES
from tests.test_hf_gemma2 import SIZES as GEMMA2_SIZES
from tests.test_hf_gemma3 import SIZES as GEMMA3_SIZES
from tests.test_hf_gemma4 import MOE as GEMMA4_MOE
from tests.test_hf_gemma4 import SIZES as GEMMA4_SIZES
from tests.test_hf_gemma4 import randomise_gemma4
from tests.test_hf_gpt_oss import VARIANTS as GPT_OSS_VARIANTS
from tests.test_hf_granite3 import EXPERTS as GRANITE3_EXPERTS
from tests.test_hf_granite3 import SIZES as GRANITE3_SIZES
from tests.test_hf_olmo2 import VARIANTS as OLMO_VARIANTS
from tests.test_hf_phi3 import SIZES as PHI3_SIZES
from tests.test_hf_phi3 import longrope as phi3_longrope
from tests.test_hf_qwen3 import SIZES as QWEN3_SIZES
from tests.test_hf_qwen3 import VARIANTS as QWEN3_VARIANTS
from tests.test_hf_qwen3_next import EXPERTS as QWEN_EXPERTS
from tests.test_hf_qwen3_next import SIZES as QWEN_SIZES
from tests.test_hf_smollm3 import SIZES as SMOLLM3_SIZES
from tests.tiny import build

TOL = 1e-4  # float32 logprobs: partial sums added in another order
MAMBA = dict(num_heads=16, head_dim=16, state_size=16, chunk_size=8, expand=2, num_hidden_layers=2)
HYBRID_MAMBA = dict(mamba_n_heads=8, mamba_d_state=16, mamba_chunk_size=8, mamba_expand=2)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", dict(attention_bias=True)),
    "mixtral": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64)),
    "deepseek-v2-lite": (
        "DeepseekV2ForCausalLM",
        dict(
            MLA_SIZES,
            **MOE_SIZES,
            q_lora_rank=None,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            norm_topk_prob=False,
        ),
    ),
    "deepseek-v3": (
        "DeepseekV3ForCausalLM",
        dict(MLA_SIZES, **MOE_SIZES, q_lora_rank=48, n_group=2, topk_group=1),
    ),
    "mamba2-one-group": ("Mamba2ForCausalLM", dict(MAMBA, n_groups=1)),
    "mamba2-groups-bias": ("Mamba2ForCausalLM", dict(MAMBA, n_groups=2, use_bias=True)),
    "granite-moe-hybrid": (
        "GraniteMoeHybridForCausalLM",
        dict(
            HYBRID_MAMBA,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=3,
            layer_types=["mamba", "attention", "mamba"],
            mamba_n_groups=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=64,
            shared_intermediate_size=96,
            position_embedding_type="rope",
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.05,
            logits_scaling=2.0,
        ),
    ),
    "nemotron-h": (
        "NemotronHForCausalLM",
        dict(
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=64,
            mamba_num_heads=8,
            mamba_head_dim=32,
            ssm_state_size=16,
            chunk_size=8,
            moe_intermediate_size=64,
            moe_shared_expert_intermediate_size=32,
            num_experts_per_tok=2,
            hybrid_override_pattern="M*M-ME",
            n_groups=2,
            n_routed_experts=8,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.0,
            mlp_bias=True,
        ),
    ),
    # Nemotron 3 Super's latent MoE: each rank projects its experts' latent sum back
    "nemotron-h-latent": (
        "NemotronHForCausalLM",
        dict(
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=64,
            mamba_num_heads=8,
            mamba_head_dim=32,
            ssm_state_size=16,
            chunk_size=8,
            moe_intermediate_size=64,
            moe_shared_expert_intermediate_size=32,
            num_experts_per_tok=2,
            hybrid_override_pattern="M*E",
            n_groups=2,
            n_routed_experts=8,
            moe_latent_size=64,
            mlp_bias=True,
        ),
    ),
    "falcon-h1": (
        "FalconH1ForCausalLM",
        dict(
            HYBRID_MAMBA,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            mamba_d_ssm=256,
            mamba_n_groups=1,
            mamba_rms_norm=True,
            mamba_norm_before_gate=False,
            embedding_multiplier=1.5,
            lm_head_multiplier=0.7,
            ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.7],
            mlp_multipliers=[1.3, 0.6],
        ),
    ),
    # gated DeltaNet (each rank its key heads and their value heads) + gated attention; Qwen3-Next's MoE with
    # its gated shared expert (expert parallel)
    "qwen3_5": ("Qwen3_5ForCausalLM", dict(QWEN_SIZES, num_hidden_layers=4)),
    "qwen3-next": ("Qwen3NextForCausalLM", dict(QWEN_SIZES, **QWEN_EXPERTS, num_hidden_layers=4)),
    # GLM-4.5: GQA with biases, per-head q/k norm and a partial rope (by heads), a dense first layer, then
    # grouped sigmoid routing with a shared expert (expert parallel)
    "glm4-moe": (
        "Glm4MoeForCausalLM",
        dict(
            num_hidden_layers=3,
            head_dim=32,
            attention_bias=True,
            use_qk_norm=True,
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=2.5,
        ),
    ),
    # fused qkv / gate_up (loaded whole, then split by blazr's own row layout), partial rope, LongRoPE
    "phi4-mini": ("Phi3ForCausalLM", dict(PHI3_SIZES, num_key_value_heads=2, **phi3_longrope(4))),
    # per-head q/k norms (each rank norms its own heads)
    "qwen3": ("Qwen3ForCausalLM", dict(QWEN3_SIZES, num_hidden_layers=2)),
    # Qwen3-MoE: sparse and dense (mlp_only_layers) layers mixed, routing not renormalised, tied embeddings
    "qwen3-moe": QWEN3_VARIANTS["qwen3-moe"],
    # sandwich norms, (1 + w) RMSNorm, sliding-window layers with their own rope θ, q/k norms
    "gemma3": ("Gemma3ForCausalLM", GEMMA3_SIZES),
    # attention and final logit soft-capping (the head's logits gathered before the cap)
    "gemma2": ("Gemma2ForCausalLM", GEMMA2_SIZES),
    # Gemma 4: KV shared across layers (each rank reads its own KV heads of the source layer), K = V full
    # layers, per-layer inputs and layer scalars (replicated), the final-logit soft-cap; two KV heads on the
    # full layers so that they split
    "gemma4": ("Gemma4ForCausalLM", dict(GEMMA4_SIZES, num_global_key_value_heads=2)),
    # and its MLP and MoE side by side, each reduced before its own post-norm; the router's input and
    # per-expert scales replicated, the experts split
    "gemma4-moe": ("Gemma4ForCausalLM", dict(GEMMA4_SIZES, num_global_key_value_heads=2, **GEMMA4_MOE)),
    # attention sinks split by heads, expert biases by experts, alternating windows, YaRN
    "gpt-oss": ("GptOssForCausalLM", GPT_OSS_VARIANTS["yarn-window"]),
    # Granite 3's multipliers (residual, attention, logits) over expert-parallel MoE
    "granite3-moe": ("GraniteMoeForCausalLM", dict(GRANITE3_SIZES, **GRANITE3_EXPERTS)),
    # NoPE every 4th layer
    "smollm3": ("SmolLM3ForCausalLM", dict(SMOLLM3_SIZES, num_hidden_layers=4)),
    # post-norm blocks, q/k norms over all heads' features (split with the heads, the mean of squares
    # all-reduced); OLMo 3: sliding-window layers with their own rope
    "olmo2": OLMO_VARIANTS["olmo2"],
    "olmo3-window": OLMO_VARIANTS["olmo3-window"],
}
# biases (transformers initialises them to zeros) made random, so a bias counted on both ranks shows; and the
# norms (ones), so that a norm weight read from the wrong rank's slice shows
RANDOMISED = {"nemotron-h-latent", "glm4-moe", "gpt-oss", "olmo2", "olmo3-window"}
# and Gemma 4's layer scalars and router scales (ones in transformers)
RANDOMISERS = {"gemma4": randomise_gemma4, "gemma4-moe": randomise_gemma4}
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [100, 200, 300], list(range(1, 42))]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, (arch, overrides) in FAMILIES.items():
        path = tmp_path_factory.mktemp(name)
        hf = build(arch, path, **overrides)
        if name in RANDOMISED or name in RANDOMISERS:
            with torch.no_grad():
                RANDOMISERS.get(name, randomise)(hf, 1)
            hf.save_pretrained(path)
        out[name] = path
    return out


def _run(path: Path, world: int, quantize: str = "auto") -> list[Any]:
    llm = LLM(path, cpu=True, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32,
              tensor_parallel_size=world, quantize=quantize)  # fmt: skip
    try:
        params = SamplingParams(temperature=0, max_tokens=10, logprobs=5, prompt_logprobs=5, ignore_eos=True)
        return llm.generate(PROMPTS, params)
    finally:
        llm.close()


def check_two_ranks_match_one(path: Path, quantize: str = "auto", tol: float = TOL) -> None:
    """2 ranks give 1 rank's greedy tokens, and its logprobs (prompt and output, top 5) within `tol`."""
    one, two = _run(path, 1, quantize), _run(path, 2, quantize)
    for a, b in zip(one, two, strict=True):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert _close(a, b) < tol


def _close(a: Any, b: Any) -> float:
    """The largest logprob difference over the top-5 entries both runs list, prompt and output."""
    worst = 0.0
    pairs = list(zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True))
    pairs += list(zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True))
    for x, y in pairs:
        worst = max(worst, abs(x.logprob - y.logprob))
        top_x, top_y = dict(x.top), dict(y.top)
        for t in set(top_x) & set(top_y):
            worst = max(worst, abs(top_x[t] - top_y[t]))
    return worst


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_ranks_give_one_ranks_tokens_and_logprobs(checkpoints, family):
    check_two_ranks_match_one(checkpoints[family])


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_quantized_shards_give_the_quantized_models_tokens(checkpoints, family):
    """`--quantize int8` quantizes each rank's slices in memory: Q8_0 blocks run along the input dimension,
    so a row-parallel slice at a block boundary holds exactly the whole layer's blocks. Only the order of
    the partial sums differs — but the kernels round activations to 8 bits per step, which turns float
    rounding into a quantization step now and then (measured: 0.045 at most on these models, where a
    wrong slice moves logprobs by whole units)."""
    check_two_ranks_match_one(checkpoints[family], "int8", 0.1)


def test_the_shards_add_up(checkpoints):
    """Per-rank sizes divide the model's, and the ranks' slices of each split tensor tile the whole."""
    ckpt = inspect_checkpoint(checkpoints["granite-moe-hybrid"])
    cfg = ckpt.config
    half = shard_config(cfg, 2)
    layer, part = cfg.layers[1], half.layers[1]
    a = layer.mixer(AttentionConfig)
    assert part.mixer(AttentionConfig).num_heads * 2 == a.num_heads
    assert part.moe.num_experts == layer.moe.num_experts  # the router sees every expert
    assert part.mixer(Mamba2Config) is None
    assert half.layers[0].mixer(Mamba2Config).num_heads * 2 == cfg.layers[0].mixer(Mamba2Config).num_heads
    qkv = torch.randn((a.num_heads + 2 * a.num_kv_heads) * a.head_dim, cfg.hidden_size)
    pieces = [slice_tensor("layers.1.attn.qkv_proj.weight", qkv, cfg, r, 2) for r in range(2)]
    q, k, v = qkv.split([a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.head_dim])
    n_q, n_kv = q.shape[0] // 2, k.shape[0] // 2
    for r, piece in enumerate(pieces):  # rank r: its q heads, then its k and v heads
        want = torch.cat(
            [q[r * n_q : (r + 1) * n_q], k[r * n_kv : (r + 1) * n_kv], v[r * n_kv : (r + 1) * n_kv]]
        )
        assert torch.equal(piece, want)
    emb = torch.randn(cfg.vocab_size, 8)
    rows = [slice_tensor("embed_tokens.weight", emb, cfg, r, 2) for r in range(2)]
    assert torch.equal(torch.cat(rows)[: cfg.vocab_size], emb)
    assert padded_vocab(1001, 4) == 1004
    o_bias = torch.ones(cfg.hidden_size)
    biases = [slice_tensor("layers.1.attn.o_proj.bias", o_bias, cfg, r, 2) for r in range(2)]
    assert torch.equal(biases[0] + biases[1], o_bias)  # counted once in the all-reduced sum
    with pytest.raises(UnsupportedError, match="Mamba2 has 2 groups, not divisible by 4"):
        shard_config(cfg, 4)


def test_an_all_heads_qk_norm_is_split_with_its_heads(checkpoints):
    """OLMo's q/k norms span all heads' features: each rank holds its heads' slice of the weights and norms
    across the ranks; per-head norms (Qwen3) stay whole on every rank."""
    cfg = inspect_checkpoint(checkpoints["olmo2"]).config
    a, part = cfg.layers[0].mixer(AttentionConfig), shard_config(cfg, 2).layers[0].mixer(AttentionConfig)
    assert not a.is_qk_norm_across_ranks and part.is_qk_norm_across_ranks
    q_norm, k_norm = torch.randn(a.num_heads * a.head_dim), torch.randn(a.num_kv_heads * a.head_dim)
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        pieces = [slice_tensor(f"layers.0.attn.{name}.weight", w, cfg, r, 2) for r in range(2)]
        assert torch.equal(torch.cat(pieces), w) and pieces[0].shape[0] * 2 == w.shape[0]
    qwen = inspect_checkpoint(checkpoints["qwen3"]).config
    head = torch.randn(qwen.layers[0].mixer(AttentionConfig).head_dim)
    assert slice_tensor("layers.0.attn.q_norm.weight", head, qwen, 1, 2) is head
    assert not shard_config(qwen, 2).layers[0].mixer(AttentionConfig).is_qk_norm_across_ranks


def test_deltanet_shards_read_their_own_key_heads():
    """Each rank's DeltaNet value heads are those of its key heads, in the shard's own order: grouped
    (contiguous) or llama.cpp's tiled order (local value head h' reads local key head h' % (Hk / world))."""
    from blazr.config import GatedDeltaNetConfig
    from blazr.model.deltanet import v_head_order

    for tiled in (False, True):
        cfg = GatedDeltaNetConfig(4, 12, 8, 8, is_v_tiled=tiled)
        shard = shard_config(ModelConfig("t", 16, 32, (LayerConfig(mixers=(cfg,)),)), 2).layers[0].mixers[0]
        r, hk = 12 // 4, shard.num_k_heads
        seen = []
        for rank in range(2):
            order = v_head_order(cfg, rank, 2)
            for local, h in enumerate(order.tolist()):
                key = h % 4 if tiled else h // r  # the key head global value head h reads
                local_key = local % hk if tiled else local // r  # the one its shard reads
                assert key == rank * hk + local_key, (tiled, rank, local, h)
            seen += order.tolist()
        assert sorted(seen) == list(range(12))


@pytest.mark.parametrize("family", ["llama", "granite-moe-hybrid"])
def test_a_two_rank_server_answers_like_one_rank(checkpoints, family):
    """A 2-rank `blazr serve`, through the openai client (a request whole and one streamed, token ids and
    logprobs), answers what one rank in this process computes for the same requests."""
    path = checkpoints[family]
    prompts, n = [[5, 6, 7], [9, 8, 7, 6]], 8
    llm = LLM(path, cpu=True, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=n, logprobs=1, ignore_eos=True)
    want = [o.outputs[0] for o in llm.generate(prompts, params)]
    args = ["--model", str(path), "--served-model-name", "m", "--max-model-len", "128", "--cpu"]  # as `llm`
    with ServerProcess([*args, "--tensor-parallel-size", "2"]) as server:
        client = server.client()
        common: dict[str, Any] = dict(model="m", max_tokens=n, temperature=0, logprobs=1)
        ids = {"return_tokens_as_token_ids": True, "ignore_eos": True}
        done = client.completions.create(prompt=prompts[0], extra_body=ids, **common).choices[0].logprobs
        stream = client.completions.create(prompt=prompts[1], stream=True, extra_body=ids, **common)
        pieces = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    got = [
        (done.tokens, done.token_logprobs),
        ([t for p in pieces for t in p.tokens], [x for p in pieces for x in p.token_logprobs]),
    ]
    for (tokens, lps), out in zip(got, want, strict=True):
        assert tokens == [f"token_id:{t}" for t in out.token_ids] and len(tokens) == n
        assert max(abs(a - b.logprob) for a, b in zip(lps, out.logprobs, strict=True)) < TOL


def test_ctrl_c_stops_every_rank_quietly(checkpoints):
    """Ctrl-C at a terminal signals the whole foreground process group: rank 0 and the ranks it spawned.
    Six concurrent requests served, then SIGINT to the group: rank 0 drains, the worker stops on rank 0's
    word (it ignores the signal itself), every process is gone, status 0, and the log gains no traceback,
    KeyboardInterrupt or RuntimeError from any rank — at most a line."""
    args = ["--model", str(checkpoints["llama"]), "--served-model-name", "m", "--max-model-len", "128"]
    server = ServerProcess([*args, "--tensor-parallel-size", "2"], new_session=True).start()
    try:
        client = server.client()
        with ThreadPoolExecutor(6) as pool:
            done = list(
                pool.map(
                    lambda i: client.completions.create(  # sampled at temperature 1: EOS may come
                        model="m", prompt=[5 + i, 6, 7], max_tokens=8, extra_body={"ignore_eos": True}
                    ),
                    range(6),
                )
            )
        assert [d.usage.completion_tokens for d in done] == [8] * 6
        workers, before = server.children(), len(server.log_text())
        assert len(workers) == 1, workers
        server.interrupt()
        assert server.wait_exit(60) == 0
        after = server.log_text()[before:]
        for word in ("Traceback", "KeyboardInterrupt", "RuntimeError", "rank1"):
            assert word not in after, after
        assert len(after.strip().splitlines()) <= 1, after
        assert not Path(f"/proc/{workers[0]}").exists(), "the worker outlived rank 0"
    finally:
        server.stop()


def test_a_spawned_rank_leaves_with_its_status_and_output_whole():
    """A spawned rank exits without the interpreter's teardown (distributed/worker.py `_leave`): its status
    is main's, and what it printed or logged — block-buffered on a pipe — still arrives."""
    code = (
        "import logging, sys\n"
        "from blazr.distributed import worker\n"
        "logging.basicConfig(format='%(message)s')\n"
        "logging.getLogger('x').warning('logged')\n"
        "print('printed', end='')\n"
        "print('blazr tensor-parallel rank 1: it failed', file=sys.stderr, end='')\n"
        "worker._leave(3)\n"
        "print('never')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert (r.returncode, r.stdout, r.stderr) == (
        3,
        "printed",
        "logged\nblazr tensor-parallel rank 1: it failed",
    )


def test_a_model_that_does_not_split_is_refused_before_any_rank_starts(checkpoints, tmp_path):
    """Heads not divisible by the ranks: one line from rank 0 and no worker traceback (the check runs
    before any rank is spawned)."""
    path = tmp_path / "odd"
    build("LlamaForCausalLM", path, num_attention_heads=3, num_key_value_heads=3, hidden_size=48)
    run = subprocess.run(
        [sys.executable, "-m", "blazr", "generate", "--model", str(path), "--cpu", "--prompt", "hi",
         "--max-tokens", "2", "--tensor-parallel-size", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert lines[-1] == "error: tensor parallel 2: layer 0's attention heads is 3, not divisible by 2", lines
    assert "Traceback" not in run.stderr


def test_torchrun_two_nodes_over_loopback(checkpoints):
    """The multi-node launch: two torchrun "nodes" (one rank each) meet over loopback; every rank runs the
    same `blazr generate` command, rank 0 prints what one process prints."""
    cmd = ["generate", "--model", str(checkpoints["llama"]), "--temperature", "0", "--max-tokens", "8"]
    cmd += ["--prompt", "a b c d"]
    alone = subprocess.run([sys.executable, "-m", "blazr", *cmd], capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    launch += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    nodes = [
        subprocess.Popen(
            [*launch, "--node-rank", str(rank), "-m", "blazr", *cmd, "--tensor-parallel-size", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outs]
    assert outs[0][0] == alone.stdout and alone.stdout.strip()
    assert outs[1][0] == ""  # rank 1 only serves rank 0's steps


def test_a_failed_parallel_step_stops_the_engine(checkpoints):
    """A step that fails on rank 0 after the others began it leaves them in a collective rank 0 never
    reaches: no later step could line up, so the engine stops (the server then exits for a supervisor to
    restart every rank) instead of retrying request by request as it does on one rank. Closing the model
    then ends those ranks instead of keeping them for the next model, which starts new ones."""
    llm = LLM(checkpoints["llama"], cpu=True, max_model_len=64, max_num_seqs=2, tensor_parallel_size=2)
    workers = ranks.spawned()
    try:

        def fail(*args: Any) -> None:
            raise RuntimeError("injected")

        llm.runner.mirror_step = fail  # type: ignore[method-assign]
        llm.engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=2))
        llm.engine.add_request("b", [4, 5, 6], SamplingParams(max_tokens=2))
        with pytest.raises(EngineBrokenError) as err:
            llm.engine.step()
        assert isinstance(err.value.__cause__, TensorParallelStepError)
    finally:
        llm.close()
    assert len(workers) == 1 and workers[0].poll() is not None and ranks.spawned() == []
    check_two_ranks_match_one(checkpoints["llama"])


def test_the_next_model_takes_the_idle_ranks(checkpoints, monkeypatch):
    """A closed model's ranks wait for this process's next model (distributed/ranks.py): another family
    loads on the same rank process and still gives one rank's tokens; a second model while one holds the
    ranks is refused in one line, and a closed model refuses to run; a model whose load fails on rank 0
    after its ranks began theirs ends them (they may wait in a broadcast), and the next model starts new
    ones."""
    check_two_ranks_match_one(checkpoints["llama"])
    first = ranks.spawned()
    check_two_ranks_match_one(checkpoints["granite-moe-hybrid"])
    assert ranks.spawned() == first and first[0].poll() is None
    held = LLM(checkpoints["llama"], cpu=True, max_model_len=64, tensor_parallel_size=2)
    try:
        with pytest.raises(BlazrError, match="holds its ranks: close it before loading another"):
            LLM(checkpoints["qwen3"], cpu=True, max_model_len=64, tensor_parallel_size=2)
        assert held.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids
    finally:
        held.close()
    assert ranks.spawned() == first
    with pytest.raises(BlazrError, match="was closed: its tensor-parallel ranks have left it"):
        held.generate([[5, 6, 7]], SamplingParams(max_tokens=2))

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("injected: rank 0's shard could not be read")

    monkeypatch.setattr("blazr.llm.load_model", broken)
    with pytest.raises(OSError, match="injected"):
        LLM(checkpoints["llama"], cpu=True, max_model_len=64, tensor_parallel_size=2)
    assert first[0].poll() is not None and ranks.spawned() == []
    monkeypatch.undo()
    check_two_ranks_match_one(checkpoints["llama"])
    assert ranks.spawned() != first


def test_a_process_ends_its_idle_ranks_when_it_exits(checkpoints):
    """A script that loads two models one after the other on 2 ranks (the second never closed: its
    `close` runs at exit) uses one rank process for both; when the script ends, so has that rank, with
    status 0 and nothing on stderr."""
    code = (
        "import sys\n"
        "from blazr import LLM, SamplingParams\n"
        "from blazr.distributed import ranks\n"
        "pids = []\n"
        "for path in sys.argv[1:]:\n"
        "    llm = LLM(path, cpu=True, max_model_len=64, tensor_parallel_size=2)\n"
        "    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))\n"
        "    assert len(out[0].outputs[0].token_ids) == 3\n"
        "    pids.append(ranks.spawned()[0].pid)\n"
        "    if path == sys.argv[1]:\n"
        "        llm.close()\n"
        "print(*pids)\n"
    )
    paths = [str(checkpoints["qwen3"]), str(checkpoints["mamba2-one-group"])]
    run = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=240)
    assert (run.returncode, run.stderr) == (0, ""), run.stderr[-3000:]
    pids = run.stdout.split()
    assert len(pids) == 2 and pids[0] == pids[1], pids
    assert not Path(f"/proc/{pids[0]}").exists(), "the rank outlived its parent"
