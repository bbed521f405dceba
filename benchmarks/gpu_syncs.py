"""Where blazr's CUDA steps wait for the GPU: every synchronizing CUDA call (a device → host read, a
pageable copy) in the decode steps after a prefill, grouped by the blazr lines that made them.

A sync per layer turns eager decode into lock-step: the host queues nothing while the GPU drains, so the
step costs launch time plus GPU time instead of the larger of the two. torch's sync debug mode reports each
one (`torch.cuda.set_sync_debug_mode`); this prints them with counts. Random bf16 weights at
a `benchmarks/hybrid_peers.py` shape (`--family`, via gpu.py) or SmolLM2's architecture (default). Run on a
CUDA machine:

    python benchmarks/gpu_syncs.py [--family qwen3.5-0.8b,lfm2-350m] [--steps 8] [--batch 4]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu import random_family, random_smollm2

SRC = str(Path(__file__).resolve().parents[1] / "src" / "blazr")


def _where() -> str:
    """The innermost blazr frames of the current stack (the call that synchronized)."""
    frames = [f for f in traceback.extract_stack() if f.filename.startswith(SRC)]
    return " ← ".join(f"{Path(f.filename).relative_to(SRC)}:{f.lineno}" for f in reversed(frames[-3:]))


def report(path: Path, label: str, steps: int, batch: int) -> str:
    from blazr import LLM, SamplingParams

    llm = LLM(path, vocab="cl100k_base", max_num_seqs=batch, max_model_len=512, enable_prefix_caching=False)
    eng = llm.engine
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    for i in range(batch):
        eng.add_request(f"s{i}", torch.randint(100, 49000, (64,), generator=g).tolist(), params)
    eng.step()  # warm-up: the prefill (allocations, cuBLAS handles)
    seen: collections.Counter[str] = collections.Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" in str(message):
            seen[_where() or f"{filename}:{lineno}"] += 1
        else:
            shown(message, category, filename, lineno, file, line)

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            n = 0
            while eng.has_unfinished() and n < steps:
                eng.step()
                n += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = shown
    lines = [f"model: {label}; {batch} sequences, {n} decode steps"]
    total = sum(seen.values())
    lines.append(f"synchronizing calls: {total} ({total / max(n, 1):.1f} a step)")
    lines += [f"  {c:5d}  {w}" for w, c in seen.most_common()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="", help="hybrid_peers.MODELS names, comma-separated")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp())
    models = [(n, lambda n=n: random_family(n, tmp / n, "cuda")) for n in args.family.split(",") if n]
    models = models or [("SmolLM2-135M architecture", lambda: random_smollm2(tmp / "smollm2"))]
    for name, build in models:
        try:
            print(report(build(), name, args.steps, args.batch), flush=True)
        except Exception as e:
            print(f"model: {name}: FAILED {type(e).__name__}: {e}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
