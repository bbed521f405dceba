"""Gemma 2 decode speed on a random checkpoint (soft-capped attention scores and final logits), float32 on
the CPU: decode tok/s with the recorded decode plan (`--fused-decode`, the default) and with the eager model
(the same kernel ops one by one), interleaved in one process, medians of --repeats runs.

    python benchmarks/gemma2_decode.py [--dir /tmp/gemma2-bench] [--repeats 5] [--prompt 128] [--tokens 64]

The checkpoint (hidden 1024, 8 layers, 8 heads of 128, 4 KV heads, MLP 4096, vocabulary 32000; caps 50 /
30) is built once under --dir and reused. Decode time = time(prompt + N tokens) − time(prompt + 1 token), so
prefill cancels. The script only uses blazr's public API, so it measures an older tree too (its `src` on
PYTHONPATH): that is how a change's before / after is compared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blazr import LLM, SamplingParams  # noqa: I001
from tests.tiny import build

SIZES = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=128,
    query_pre_attn_scalar=128,
    sliding_window=4096,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    max_position_embeddings=8192,
    initializer_range=0.02,
)


def _decode_seconds(llm: LLM, prompt: list[int], tokens: int) -> float:
    def run(n: int) -> float:
        t0 = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - t0

    return run(tokens + 1) - run(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gemma2-bench"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    if not (args.dir / "config.json").exists():
        build("Gemma2ForCausalLM", args.dir, **SIZES)
    prompt = torch.randint(10, SIZES["vocab_size"] - 10, (args.prompt,), generator=torch.Generator()).tolist()
    llms = {
        mode: LLM(args.dir, cpu=True, dtype="float32", max_num_seqs=1, max_model_len=1024, fused_decode=fused)
        for mode, fused in (("plan", True), ("eager", False))
    }
    for mode, llm in llms.items():
        print(f"{mode}: decode plan {'recorded' if llm.runner.decode_plan is not None else 'off'}")
        _decode_seconds(llm, prompt, 4)  # warm-up
    times: dict[str, list[float]] = {mode: [] for mode in llms}
    for _ in range(args.repeats):
        for mode, llm in llms.items():
            times[mode].append(_decode_seconds(llm, prompt, args.tokens))
    for mode, ts in times.items():
        med = statistics.median(ts)
        ms = med * 1e3 / args.tokens
        print(f"{mode}: {args.tokens / med:.1f} tok/s (median of {len(ts)}: {ms:.2f} ms/token)")
    print("loadavg:", Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
