"""Batched decode (issue 14's "Batched" target): blazr vs llama.cpp, aggregate decode tok/s at N sequences.

    python benchmarks/batched.py [--seqs 4 16] [--prompt-len 128] [--gen 32] [--rounds 2] [--threads 2]
                                 [--only Q4_0 Q8_0 Q4_K_M F16 bf16] [--cache DIR]

The checkpoints are benchmarks/realsize.py's (its `build()`: the Llama-3.2-1B shape with SmolLM2's 49k
vocabulary, GGUFs by llama.cpp's converter and quantizer; built once into --cache, default realsize's
benchmarks/.cache/1b). Both engines run the same GGUF; blazr with `quantize="auto"` (tensors kept as
stored, F16 included). `bf16`: blazr loads the bf16 HF checkpoint with `quantize="bf16"` (its weights coded
where the host decodes them, kernels/coded.py) against llama.cpp on the F16 GGUF.

Each measurement runs in a fresh process (this file with `--child`, the engine alone in it). N different
--prompt-len prompts are prefilled, then decoded greedily (temperature 0, ignore_eos) to --gen tokens each:

- llama.cpp (llama-cpp-python's low-level API): one `llama_batch` holding all N prompts (sequence ids
  0 … N-1) in one `llama_decode`; each sequence's first token is the argmax of its last prompt position.
  Then --gen - 1 timed steps, each ONE `llama_decode` of N tokens (one per sequence) and N argmaxes.
  Context: n_seq_max = N, n_ctx = N × (prompt + gen + 16) (the KV cache is split per sequence),
  n_threads = n_threads_batch = --threads.
- blazr: `LLM(..., max_num_seqs=N, max_num_batched_tokens=max(512, N × prompt))`, so all N prompts
  prefill in one engine step and every later step is a pure decode of N sequences (the budget only
  removes chunking; the scheduler is blazr's own). The N requests are added to `llm.engine` and driven by
  `engine.step()` (what `LLM.generate` does), timing each step.

Aggregate decode tok/s = tokens produced after the last sequence's first token / the time from that first
token to the end (N × (gen - 1) when every decode step holds all N sequences; the child reports if not).
Also shown: each engine's peak RSS (the child process's VmHWM; llama.cpp's mmapped weights count once
touched). Sanity: llama.cpp's sequence 0 is re-run alone (same context, cache cleared) for its first two
tokens (the prefill's and the first decode step's); a mismatch with the batched run prints a warning.
Rounds alternate the engine order; the table holds medians. Speed is reported, never asserted. Each run's
line on stderr adds its load, prefill and median decode step: an aggregate far below N / median step means
the run shared the cores (llama.cpp's spinning thread pool loses the most then; run on a quiet machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
PRECISIONS = ("Q4_0", "Q8_0", "Q4_K_M", "F16", "bf16")
BLAZR_QUANTIZE = {"bf16": "bf16"}  # blazr's --quantize where it is not `auto` (on the HF checkpoint)


def prompt_ids(seq: int, plen: int) -> list[int]:
    return [(i * 7919 + seq * 31) % 40000 + 100 for i in range(plen)]


# ------------------------------------------------------------------------------------------ children


def child_llama_cpp(path: str, nseq: int, plen: int, gen: int, threads: int, quantize: str) -> dict[str, Any]:
    del quantize  # llama.cpp runs the GGUF as stored
    import llama_cpp
    import numpy as np

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = nseq * (plen + gen + 16)
    cparams.n_batch = max(512, nseq * plen)
    cparams.n_seq_max = nseq
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create the context")
    load = time.perf_counter() - t0
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    batch = llama_cpp.llama_batch_init(max(512, nseq * plen), 0, 1)

    def fill(entries: list[tuple[int, int, int, bool]]) -> None:
        """(token, position, sequence id, wants logits) per batch row."""
        for i, (tok, pos, seq, logits) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        batch.n_tokens = len(entries)

    def decode() -> None:
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")

    def argmax(row: int) -> int:
        ptr = llama_cpp.llama_get_logits_ith(ctx, row)  # POINTER(c_float), n_vocab of them
        return int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())

    prompts = [prompt_ids(s, plen) for s in range(nseq)]
    t = time.perf_counter()
    fill([(tok, i, s, i == plen - 1) for s, p in enumerate(prompts) for i, tok in enumerate(p)])
    decode()
    out = [[argmax(s * plen + plen - 1)] for s in range(nseq)]
    first = time.perf_counter()
    marks = [first]
    for step in range(gen - 1):
        fill([(out[s][-1], plen + step, s, True) for s in range(nseq)])
        decode()
        for s in range(nseq):
            out[s].append(argmax(s))
        marks.append(time.perf_counter())
    end = marks[-1]

    # sequence 0 alone: same context (cache cleared), a batch of one sequence
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    fill([(tok, i, 0, i == plen - 1) for i, tok in enumerate(prompts[0])])
    decode()
    alone = [argmax(plen - 1)]
    if gen > 1:
        fill([(alone[0], plen, 0, True)])
        decode()
        alone.append(argmax(0))

    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    llama_cpp.llama_backend_free()
    return {
        "load": load,
        "prefill_s": first - t,
        "decode": nseq * (gen - 1) / (end - first),
        "decode_tokens": nseq * (gen - 1),
        "step_ms": 1e3 * statistics.median(b - a for a, b in itertools.pairwise(marks)),
        "pure_decode": True,
        "seq0": out[0][:2],
        "seq0_alone": alone,
    }


def child_blazr(path: str, nseq: int, plen: int, gen: int, threads: int, quantize: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from blazr import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        path, cpu=True, quantize=quantize, max_model_len=plen + gen + 16, max_num_seqs=nseq,
        max_num_batched_tokens=max(512, nseq * plen), enable_prefix_caching=False,
    )  # fmt: skip
    load = time.perf_counter() - t0
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    engine = llm.engine
    rids = [f"seq{s}" for s in range(nseq)]
    t = time.perf_counter()
    for s, rid in enumerate(rids):
        engine.add_request(rid, prompt_ids(s, plen), params)
    firsts: dict[str, float] = {}
    tokens: dict[str, list[int]] = {rid: [] for rid in rids}
    steps: list[tuple[float, int]] = []  # (end of step, tokens it produced)
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        n = 0
        for o in outs:
            if o.error is not None:
                raise SystemExit(f"blazr request {o.request_id} failed: {o.error!r}")
            if o.token_ids and o.request_id not in firsts:
                firsts[o.request_id] = now
                n += len(o.token_ids) - 1  # a first token is the prefill's
            else:
                n += len(o.token_ids)
            tokens[o.request_id].extend(o.token_ids)
        steps.append((now, n))
    end = time.perf_counter()
    first = max(firsts.values())
    after = sum(n for when, n in steps if when > first)
    marks = [first] + [when for when, _ in steps if when > first]
    llm.close()
    return {
        "load": load,
        "prefill_s": first - t,
        "decode": after / (end - first),
        "decode_tokens": after,
        "step_ms": 1e3 * statistics.median(b - a for a, b in itertools.pairwise(marks)),
        "pure_decode": after == nseq * (gen - 1),
        "seq0": tokens["seq0"][:2],
    }


def peak_rss_gib() -> float:
    """This process's peak RSS (VmHWM). Not ru_maxrss: Linux carries it over exec, so a child started by
    a parent that had just built a checkpoint would report the parent's peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20


def child(args: argparse.Namespace) -> None:
    engine, path, nseq, plen, gen, threads, quantize = args.child
    run = child_llama_cpp if engine == "llama.cpp" else child_blazr
    res = run(path, int(nseq), int(plen), int(gen), int(threads), quantize)
    res["rss"] = peak_rss_gib()
    print(json.dumps(res), flush=True)


# -------------------------------------------------------------------------------------------- parent


def measure(
    engine: str, path: Path, nseq: int, args: argparse.Namespace, quantize: str = "auto"
) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE), "--child", engine, str(path), str(nseq), str(args.prompt_len)]
    cmd += [str(args.gen), str(args.threads), quantize]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{engine} on {path.name} at {nseq} sequences failed:\n{done.stderr[-3000:]}")
    res: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    label = f"{engine} {path.name} N={nseq}"
    print(
        f"  {label}: load {res['load']:.1f} s, prefill {res['prefill_s']:.1f} s, "
        f"decode {res['decode']:.2f} tok/s (median step {res['step_ms']:.0f} ms), "
        f"peak RSS {res['rss']:.2f} GiB",
        file=sys.stderr,
        flush=True,
    )
    if not res["pure_decode"]:
        print(f"  note: {label}: not every decode step held all {nseq} sequences", file=sys.stderr)
    if "seq0_alone" in res and res["seq0"] != res["seq0_alone"]:
        print(
            f"  WARNING: {label}: sequence 0's first tokens batched {res['seq0']} != alone "
            f"{res['seq0_alone']}",
            file=sys.stderr,
            flush=True,
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    ap.add_argument("--seqs", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    ap.add_argument("--cache", type=Path, default=None, help="the 1B checkpoints (default: realsize's)")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.gen < 2:
        raise SystemExit("--gen must be ≥ 2 (the first token is the prefill's)")

    sys.path.insert(0, str(HERE.parent))
    import realsize

    files = realsize.build(
        [p for p in args.only if p in realsize.PRECISIONS],
        (args.cache or realsize.CACHE_ROOT / "1b").resolve(),
    )

    results: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for p in args.only:
            for nseq in args.seqs:
                order = ["blazr", "llama.cpp"]
                for engine in order if r % 2 == 0 else order[::-1]:
                    print(f"round {r + 1}: {p} N={nseq}: {engine} …", file=sys.stderr, flush=True)
                    path, mode = files[p if p in files else "F16"], "auto"
                    if engine == "blazr" and p in BLAZR_QUANTIZE:
                        path, mode = files["hf"], BLAZR_QUANTIZE[p]
                    results.setdefault((p, nseq, engine), []).append(measure(engine, path, nseq, args, mode))
                    time.sleep(1)

    def med(p: str, nseq: int, engine: str, key: str) -> float:
        return statistics.median(x[key] for x in results[(p, nseq, engine)])

    print(
        f"1B shape (Llama-3.2-1B, 49k vocabulary), N sequences × {args.prompt_len}-token prompts, "
        f"{args.gen} tokens each, {args.threads} threads, medians of {args.rounds} rounds, "
        "each engine in a fresh process"
    )
    sys.path.insert(0, str(HERE.parent.parent))
    from benchmarks.host import host_line

    print(f"\nmachine: {host_line()}")
    print()
    columns = (
        "weights", "sequences", "blazr decode tok/s (aggregate)", "llama.cpp decode tok/s (aggregate)",
        "blazr ×", "blazr peak RSS GiB", "llama.cpp peak RSS GiB",
    )  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p in args.only:
        for nseq in args.seqs:
            b, c = med(p, nseq, "blazr", "decode"), med(p, nseq, "llama.cpp", "decode")
            rb, rc = med(p, nseq, "blazr", "rss"), med(p, nseq, "llama.cpp", "rss")
            label = f"HF bf16 `--quantize {BLAZR_QUANTIZE[p]}` vs F16" if p in BLAZR_QUANTIZE else f"{p} GGUF"
            print(f"| {label} | {nseq} | {b:.2f} | {c:.2f} | {b / c:.2f} | {rb:.2f} | {rc:.2f} |")


if __name__ == "__main__":
    main()
