"""Tensor parallel on one machine: 1 rank vs N ranks (gloo, this machine's cores shared among them).

    python benchmarks/tensor_parallel.py --model benchmarks/.cache/1b/hf [--ranks 1 2] [--prompt-len 200]

For each rank count, in a fresh process each: load time, peak RSS of rank 0 (and of the other ranks, read
from /proc while they live), prefill tok/s of one prompt, decode tok/s of 1 and of 4 sequences (greedy,
ignore_eos; the prefix cache off, so that a repeated prompt is prefilled again). Float32 weights. On a
2-core machine N = 2 cannot gain: each rank gets one core and every layer adds two all-reduces — the table
says what it costs. The point of N ranks is a model larger than one process can hold, or more than one
machine (torchrun --nnodes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

CHILD = r"""
import json, os, sys, time, threading
from blazr import LLM, SamplingParams
model, world, plen, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
llm = LLM(model, cpu=True, dtype="float32", quantize="none", max_model_len=plen + gen + 8, max_num_seqs=4,
          max_num_batched_tokens=max(512, plen), tensor_parallel_size=world, enable_prefix_caching=False)
load = time.perf_counter() - t0
peers = [p.pid for p in getattr(llm, "_workers", [])]
peak_peer = [0]
def watch():
    while True:
        for pid in peers:
            try:
                for line in open(f"/proc/{pid}/status"):
                    if line.startswith("VmHWM:"):
                        peak_peer[0] = max(peak_peer[0], int(line.split()[1]) * 1024)
            except OSError:
                return
        time.sleep(0.2)
threading.Thread(target=watch, daemon=True).start()
prompt = [(i * 7919) % 1000 + 10 for i in range(plen)]
one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
llm.generate([prompt], one)  # warm-up
t = time.perf_counter(); llm.generate([prompt], one); prefill = plen / (time.perf_counter() - t)
out = {}
for n in (1, 4):
    ps = [[p + k for p in prompt[:32]] for k in range(n)]
    sp = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    t = time.perf_counter(); llm.generate(ps, short); first = time.perf_counter() - t
    t = time.perf_counter(); llm.generate(ps, sp); total = time.perf_counter() - t
    out[n] = n * (gen - 1) / max(total - first, 1e-9)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec (the parent's peak)
rss = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')) * 1024
llm.close()
result = dict(load=load, prefill=prefill, decode1=out[1], decode4=out[4], rss=rss, peer_rss=peak_peer[0])
print(json.dumps(result))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--gen", type=int, default=32)
    args = ap.parse_args()
    rows = []
    for world in args.ranks:
        cmd = [sys.executable, "-c", CHILD, args.model, str(world), str(args.prompt_len), str(args.gen)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{world} ranks failed")
        rows.append((world, json.loads(done.stdout.strip().splitlines()[-1])))
        time.sleep(2)
    gib = 2**30
    print(f"model {args.model}, float32, {args.prompt_len}-token prompt, {args.gen} tokens")
    print("| ranks | load s | rank 0 peak RSS GiB | other rank peak RSS GiB | prefill tok/s | decode 1 seq |"
          " decode 4 seqs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for world, r in rows:
        peer = f"{r['peer_rss'] / gib:.2f}" if world > 1 else "—"
        print(f"| {world} | {r['load']:.1f} | {r['rss'] / gib:.2f} | {peer} | {r['prefill']:.1f} | "
              f"{r['decode1']:.2f} | {r['decode4']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
