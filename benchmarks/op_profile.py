"""Per-kernel-call time of one model's prefill and decode step on the CPU kernels (where the time goes).

    python benchmarks/op_profile.py MODEL [--quantize auto|none|int8|int4|bf16] [--prompt-len 500] [--gen 16]
                                    [--threads 2] [--reps 20] [--warm 1]

MODEL: a GGUF file or a checkpoint directory (with --quantize as `blazr --quantize`).

Prefill: the prompt's eager forward (after --warm untimed ones: a fresh process's first prefill also times
the page faults of memory touched the first time) with every kernel call timed (`Kernels._run` wrapped: a
call's wall time, keyed by name and, for linears, kind and M × K → N); the forward's time not inside a
kernel call is shown as "outside kernels" (torch ops, Python). Decode: the recorded decode plan
(engine/decode_plan.py) of one sequence, after --gen tokens, replayed `--reps` times one call at a time in
order (median per call), against the whole plan's replay. Timings of calls a few µs long include the Python
around them (~2-4 µs a call): read the large entries. Speed only; nothing is checked.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections import defaultdict

import torch


def _key(name: str, args) -> str:
    if name.startswith("linear["):
        return f"{name} {args.i[2]}x{args.i[3]}->{args.i[5]}{' swiglu' if args.i[9] else ''}"
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", metavar="MODEL")
    ap.add_argument("--quantize", default="auto")
    ap.add_argument("--prompt-len", type=int, default=500)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warm", type=int, default=1, help="untimed whole prefills first (0: time the cold one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from blazr import LLM, SamplingParams
    from blazr.kernels import bindings
    from blazr.kernels.calls import _Args

    llm = LLM(
        args.gguf, cpu=True, quantize=args.quantize, max_model_len=args.prompt_len + args.gen + 16,
        max_num_seqs=1, max_num_batched_tokens=args.prompt_len, enable_prefix_caching=False,
    )  # fmt: skip
    prompt = [(i * 7919) % 40000 + 100 for i in range(args.prompt_len)]
    sp = SamplingParams(temperature=0, max_tokens=args.gen, ignore_eos=True)
    for _ in llm.stream_ids(prompt[:32], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)):
        pass  # warm: the kernels loaded, the plan recorded
    for _ in range(args.warm):  # the whole prompt's buffers touched: a first prefill's faults untimed
        for _ in llm.stream_ids(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)):
            pass

    times: dict[str, list[float]] = defaultdict(list)
    orig = bindings.Kernels._run

    def timed(self, a, addr, name, *tensors):
        if getattr(self._tls, "plan", None) is not None:
            return orig(self, a, addr, name, *tensors)
        t = time.perf_counter()
        orig(self, a, addr, name, *tensors)
        times[_key(name, a)].append(time.perf_counter() - t)

    bindings.Kernels._run = timed
    t0 = time.perf_counter()
    first = None
    for _ in llm.stream_ids(prompt, sp):
        if first is None:
            first = time.perf_counter()
            bindings.Kernels._run = orig
    end = time.perf_counter()
    total = first - t0
    inside = sum(sum(v) for v in times.values())
    print(f"prefill {args.prompt_len} tokens: {total * 1e3:.1f} ms ({args.prompt_len / total:.1f} tok/s), "
          f"decode {(args.gen - 1) / (end - first):.2f} tok/s")  # fmt: skip
    rows = sorted(((sum(v), len(v), k) for k, v in times.items()), reverse=True)
    for s, n, k in rows:
        print(f"  {s * 1e3:8.1f} ms {100 * s / total:5.1f} %  {n:4d} calls  {k}")
    print(f"  {(total - inside) * 1e3:8.1f} ms {100 * (total - inside) / total:5.1f} %  outside kernels")

    plan = llm.runner.decode_plan
    if plan is None:
        print("decode: no recorded plan (eager)")
        return
    kp = plan._plans[1].plan
    kp.run()
    whole = []
    for _ in range(args.reps):
        t = time.perf_counter()
        kp.run()
        whole.append(time.perf_counter() - t)
    one = ctypes.c_int64(-1)
    arrays = [(_Args * 1)(call) for call in kp._calls]
    samples: list[list[float]] = [[] for _ in arrays]
    for _ in range(args.reps):  # the step's calls in order, each timed: the weights as cold as in a step
        for j, arr in enumerate(arrays):
            t = time.perf_counter()
            kp._call_many(ctypes.addressof(arr), 1, ctypes.addressof(one))
            samples[j].append(time.perf_counter() - t)
    per: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for call, name, ts in zip(kp._calls, kp._names, samples, strict=True):
        per[_key(name, call)] += statistics.median(ts)
        count[_key(name, call)] += 1
    w = statistics.median(whole)
    print(f"decode step (plan replay, {len(kp)} calls): {w * 1e3:.2f} ms ({1 / w:.1f} steps/s); "
          f"calls one at a time sum to {sum(per.values()) * 1e3:.2f} ms")  # fmt: skip
    for k, s in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {s * 1e3:8.3f} ms {100 * s / w:5.1f} %  {count[k]:4d} calls  {k}")


if __name__ == "__main__":
    main()
