"""Hybrid-model speed: prefill and decode tok/s of random checkpoints shaped like the oxidizr presets and a
tiny GraniteMoeHybrid, Mamba2 decode cost versus context, and MoE cost versus total/active experts.

    python benchmarks/hybrid.py [--repeats 3] [--dtype float32] [--quick]

Checkpoints are built in a temp dir (random weights: speed only). Medians of --repeats runs after a warm-up.
--quick measures at shorter contexts (64 / 256 / 1024 instead of 128 / 512 / 4096). `benchmarks/run.py`
prints the same tables through `report()`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blazr import LLM, SamplingParams  # noqa: I001
from blazr.model.mixers import cache_layout
from tests.oxidizr_fixtures import OxSizes, write_oxidizr

# oxidizr "nano" (spec §8): 123M parameters, Mamba2 ×6 + MLA/MoE ×2
NANO_FULL = OxSizes(
    hidden=384,
    vocab=128354,
    heads=6,
    kv_latent=192,
    q_latent=192,
    d_rope=16,
    experts=4,
    experts_per_tok=2,
    intermediate=1536,
    mamba_heads=48,
    mamba_head_dim=16,
    state=64,
    chunk=64,
    max_seq_len=8192,
    layers=("Mamba2",) * 3 + ("MlaWithMoe",) + ("Mamba2",) * 3 + ("MlaWithMoe",),
)
NANO_MAMBA2 = dataclasses.replace(NANO_FULL, layers=("Mamba2",) * 8)

CONTEXTS = (128, 512, 4096)  # decode ms/token after prompts of these lengths; prefill tok/s at the middle
QUICK_CONTEXTS = (64, 256, 1024)
LONG = 2048  # contexts from here on: 16 generated tokens and one repeat less (each run is slow)


def _ids(n: int, vocab: int) -> list[int]:
    return torch.randint(10, vocab - 10, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prefill_decode(llm: LLM, prompt_len: int, gen: int, repeats: int) -> tuple[float, float]:
    """(prefill tok/s, decode ms/token) after a prompt of prompt_len tokens."""
    ids = _ids(prompt_len, llm.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    prefill, decode = [], []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        first = None
        for _ in llm.stream_ids(ids, params):
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        assert first is not None
        if r:  # the first run warms up
            prefill.append(prompt_len / (first - t0))
            decode.append((end - first) / (gen - 1) * 1e3)
    return statistics.median(prefill), statistics.median(decode)


def params_of(llm: LLM) -> float:
    return sum(p.numel() for p in llm.model.parameters()) / 1e6


def _load(path: Path, dtype: str, contexts: tuple[int, ...]) -> LLM:
    longest = max(contexts)
    return LLM(path, cpu=True, dtype=dtype, max_model_len=longest + 64, max_num_batched_tokens=longest)


def _granite(root: Path) -> Path:
    from tests.tiny import build

    build(
        "GraniteMoeHybridForCausalLM",
        root,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["mamba", "mamba", "attention", "mamba"],
        num_local_experts=8,
        num_experts_per_tok=2,
        shared_intermediate_size=512,
        mamba_n_heads=16,
        mamba_d_head=32,
        mamba_d_state=64,
        mamba_n_groups=1,
        mamba_chunk_size=64,
        vocab_size=49152,
        max_position_embeddings=8192,
        initializer_range=0.02,
    )
    return root


def model_table(root: Path, repeats: int, dtype: str, contexts: tuple[int, ...] = CONTEXTS) -> str:
    """Markdown table: per model, prefill tok/s at the middle context and decode ms/token at each context."""
    mid = contexts[len(contexts) // 2]
    models = (
        ("oxidizr nano (M×6 + MLA/MoE×2)", lambda: write_oxidizr(root / "nano", NANO_FULL).parent),
        ("oxidizr nano, Mamba2 ×8", lambda: write_oxidizr(root / "m8", NANO_MAMBA2).parent),
        ("tiny GraniteMoeHybrid (M,M,A,M; 8 experts top-2)", lambda: _granite(root / "granite")),
    )
    at = " | ".join(f"@{c}" for c in contexts[1:])
    rows = [
        f"| model | params | prefill tok/s @{mid} | decode ms/tok @{contexts[0]} | {at} "
        "| cache B/tok | state B/seq |",
        "|---|---:|---:|" + "---:|" * len(contexts) + "---:|---:|",
    ]
    for name, write in models:
        _log(f"# hybrid: {name}")
        llm = _load(write(), dtype, contexts)
        prefill, decode = 0.0, []
        for c in contexts:
            long = c >= LONG
            p, d = prefill_decode(llm, c, 16 if long else 32, max(1, repeats - 1) if long else repeats)
            prefill = p if c == mid else prefill
            decode.append(f"{d:.2f}")
        layout = cache_layout(llm.config)
        kv, state = layout.bytes_per_token(llm.dtype), layout.state_bytes_per_sequence(llm.dtype)
        rows.append(
            f"| {name} | {params_of(llm):.1f}M | {prefill:.0f} | {' | '.join(decode)} | {kv} | {state} |"
        )
        _log(rows[-1])
        del llm
    return "\n".join(rows)


def moe_table(root: Path, repeats: int, dtype: str, prompt_len: int = 512) -> str:
    """Markdown table: 4 × MLA+MoE layers, prefill tok/s and decode ms/token vs total and active experts."""
    rows = ["| experts | top-k | params | prefill tok/s | decode ms/tok |", "|---:|---:|---:|---:|---:|"]
    for experts, k in ((4, 2), (16, 2), (64, 2), (16, 4)):
        _log(f"# hybrid: MoE {experts} experts, top-{k}")
        sizes = dataclasses.replace(
            NANO_FULL, vocab=32000, experts=experts, experts_per_tok=k, layers=("MlaWithMoe",) * 4
        )
        llm = _load(write_oxidizr(root / f"moe-{experts}-{k}", sizes).parent, dtype, (prompt_len,))
        p, d = prefill_decode(llm, prompt_len, 32, repeats)
        rows.append(f"| {experts} | {k} | {params_of(llm):.1f}M | {p:.0f} | {d:.2f} |")
        _log(rows[-1])
        del llm
    return "\n".join(rows)


def report(repeats: int = 3, dtype: str = "float32", contexts: tuple[int, ...] = CONTEXTS) -> str:
    """Both tables as markdown (checkpoints written to a temp dir removed afterwards)."""
    mid = contexts[len(contexts) // 2]
    with tempfile.TemporaryDirectory(prefix="blazr-hybrid-bench-") as tmp:
        root = Path(tmp)
        models = model_table(root, repeats, dtype, contexts)
        moe = moe_table(root, repeats, dtype, mid)
    long = f" ({max(1, repeats - 1)} runs of 16 tokens at contexts ≥ {LONG})" if max(contexts) >= LONG else ""
    return (
        f"dtype {dtype}, torch threads {torch.get_num_threads()}, medians of {repeats} runs after a warm-up, "
        f"decode over 32 generated tokens{long}\n\n"
        f"{models}\n\n"
        f"MoE cost vs experts (4 × MLA+MoE layers, hidden 384, expert width 1536, prompt {mid}):\n\n"
        f"{moe}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quick", action="store_true", help=f"contexts {QUICK_CONTEXTS} instead of {CONTEXTS}")
    args = ap.parse_args(argv)
    print(report(args.repeats, args.dtype, QUICK_CONTEXTS if args.quick else CONTEXTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
