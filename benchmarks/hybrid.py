"""Hybrid-model speed: prefill and decode tok/s of random checkpoints shaped like the oxidizr presets and a
tiny GraniteMoeHybrid, Mamba2 decode cost versus context, and MoE cost versus total/active experts.

    python benchmarks/hybrid.py [--repeats 3] [--dtype float32]

Checkpoints are built in a temp dir (random weights: speed only). Medians of --repeats runs after a warm-up.
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
from blazr.state.kv_cache import bytes_per_token, state_bytes_per_sequence
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


def _ids(n: int, vocab: int) -> list[int]:
    return torch.randint(10, vocab - 10, (n,), generator=torch.Generator().manual_seed(n)).tolist()


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
        if r:  # the first run warms up
            prefill.append(prompt_len / (first - t0))
            decode.append((end - first) / (gen - 1) * 1e3)
    return statistics.median(prefill), statistics.median(decode)


def params_of(llm: LLM) -> float:
    return sum(p.numel() for p in llm.model.parameters()) / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="blazr-hybrid-bench-"))
    rows = []

    def load(path: Path) -> LLM:
        return LLM(path, cpu=True, dtype=args.dtype, max_model_len=4096 + 64, max_num_batched_tokens=4096)

    def row(name: str, llm: LLM) -> str:
        p512, d512 = prefill_decode(llm, 512, 32, args.repeats)
        _, d128 = prefill_decode(llm, 128, 32, args.repeats)
        _, d4096 = prefill_decode(llm, 4096, 16, max(1, args.repeats - 1))
        kv, state = bytes_per_token(llm.config, llm.dtype), state_bytes_per_sequence(llm.config, llm.dtype)
        size = f"{params_of(llm):.1f}M"
        line = f"| {name} | {size} | {p512:.0f} | {d128:.2f} | {d512:.2f} | {d4096:.2f} | {kv} | {state} |"
        print(line, file=sys.stderr, flush=True)
        return line

    presets = (
        ("oxidizr nano (M×6 + MLA/MoE×2)", "nano", NANO_FULL),
        ("oxidizr nano, Mamba2 ×8", "m8", NANO_MAMBA2),
    )
    for name, folder, sizes in presets:
        rows.append(row(name, load(write_oxidizr(root / folder, sizes, with_config=True).parent)))

    from tests.tiny import build

    build(
        "GraniteMoeHybridForCausalLM",
        root / "granite",
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
    rows.append(row("tiny GraniteMoeHybrid (M,M,A,M; 8 experts top-2)", load(root / "granite")))

    moe_rows = []
    for experts, k in ((4, 2), (16, 2), (64, 2), (16, 4)):
        sizes = dataclasses.replace(
            NANO_FULL, vocab=32000, experts=experts, experts_per_tok=k, layers=("MlaWithMoe",) * 4
        )
        llm = load(write_oxidizr(root / f"moe-{experts}-{k}", sizes).parent)
        p, d = prefill_decode(llm, 512, 32, args.repeats)
        moe_rows.append(f"| {experts} | {k} | {params_of(llm):.1f}M | {p:.0f} | {d:.2f} |")
        print(moe_rows[-1], file=sys.stderr, flush=True)

    print(f"dtype {args.dtype}, torch threads {torch.get_num_threads()}, medians of {args.repeats}\n")
    print(
        "| model | params | prefill tok/s | decode ms/tok @128 | @512 | @4096 | cache B/tok | state B/seq |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print("\nMoE cost vs experts (4 × MLA+MoE layers, hidden 384, expert width 1536):\n")
    print("| experts | top-k | params | prefill tok/s | decode ms/tok |")
    print("|---:|---:|---:|---:|---:|")
    print("\n".join(moe_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
