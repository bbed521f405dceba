"""The prefix-caching benchmark (issue 15): multi-turn chat with the cache on vs off, the Mamba2 snapshot
interval's memory / hit-rate trade-off, and `blazr bench` against `blazr serve` with a shared system prompt.

    python benchmarks/prefix.py [--parts chat,sweep,serve] [--models smollm2,granite-4.0-h-350m]
                                [--rounds 3] [--turns 5] [--system-words 1300] [--user-words 60]
                                [--reply-tokens 64] [--intervals 1,2,4,8,16] [--threads 2] [--json FILE]

Part 1, chat (`LLM` in-process, no server): a conversation of --turns turns; every turn re-sends the whole
conversation through the chat template — a system prompt of --system-words random words (≈ tokens), a
first user message of --first-user-words, then per turn the assistant's actual (greedy) reply and a new user
message of --user-words — so turn 2 shares ~1,500 tokens with turn 1 and each later turn ~130 more. Two
engines on the same weights, one with `EngineConfig.enable_prefix_caching` off and one with it on, run each
turn on the same token ids (the order alternating), and the conversation goes on with the cache-off
engine's reply. TTFT = from `add_request` to the first token (the engine stepped by hand, nothing else
queued). "shared" = tokens the turn's prompt has in common with the previous turn's prompt + reply (what a
perfect cache could serve); "cached" = `SeqOutput.num_cached_tokens` of the cache-on engine. Every round is
a new conversation (new words), so no round finds the last one's turns; medians over --rounds rounds.
Models: the embedded SmolLM2-135M (Q4_1 GGUF) and granite-4.0-h-350m's published shape (random weights,
benchmarks/hybrid_peers.py builds it once; --hybrid-quantize int8 by default): 28 Mamba2 + 4 attention
layers, so a hit resumes from a Mamba2 state snapshot. Snapshot memory = snapshots held ×
`CacheLayout.state_bytes_per_sequence` (conv + SSM state of every Mamba2 layer), per distinct cached prefix
token; the
cache-on engine gets --snapshots snapshot slots (default 160: none is evicted in these runs, so the count
is what the workload leaves, not what the default pool could keep).

Part 2, sweep (the hybrid only): `EngineConfig.state_snapshot_interval` = each of --intervals (blocks of
16 tokens), hit rate vs snapshot memory on two workloads, each on a fresh engine over one loaded model (the
snapshot pool sized so that nothing is evicted: the memory an unbounded pool would hold); --sweep-rounds
passes over the intervals and the cache off, the order reversed every other pass, times are medians:
  A. the multi-turn chat of part 1 (one conversation; its replies fixed beforehand by a cache-off pass);
  B. --groups system prompts of random lengths in [--sp-min, --sp-max] words (the shared part ends at an
     arbitrary token), each followed by --group-size different user messages, sent one after another
     (max_tokens 1); a fresh engine per group, snapshot counts summed over groups.
"ideal" = the hit rate of a cache that could cut anywhere (shared tokens, full blocks only).

Part 3, serve: two `blazr serve` processes on the embedded SmolLM2 (one with `--no-prefix-cache`), both up,
measured in turns: `blazr bench --shared-prefix-len --bench-shared` words of shared system prompt before
`--bench-input` words of each prompt, --bench-prompts requests per concurrency level 1 / 4 / 16,
--bench-output tokens each (`ignore_eos`); a new shared prompt every round (the bench's warm-up request
puts it in the cache: the levels measure a server that already holds its system prompt).

Speed is reported here, never asserted. The machine may be shared: rounds alternate the engines' order and
medians are reported; check that nothing else runs (`ps aux --sort=-%cpu | head`).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.host import host_line  # noqa: E402
from benchmarks.hybrid_peers import checkpoint  # noqa: E402  (builds the published-shape hybrid once)
from benchmarks.run import log, spread, versions  # noqa: E402
from benchmarks.serve import Server, embedded_gguf  # noqa: E402

from blazr import LLM, SamplingParams  # noqa: E402
from blazr.bench import WORDS  # noqa: E402
from blazr.config import EngineConfig  # noqa: E402
from blazr.distributed.worker import free_port  # noqa: E402
from blazr.engine.engine import LLMEngine  # noqa: E402
from blazr.model.mixers import cache_layout  # noqa: E402

HYBRID = "granite-4.0-h-350m"
MODELS = ("smollm2", HYBRID)
PARTS = ("chat", "sweep", "serve")
BLOCK = EngineConfig.block_size
MiB = 1 << 20


# ------------------------------------------------------------------------------------------ workloads


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@dataclass
class Chat:
    """One conversation: the system prompt and the user message of every turn (replies come as it runs)."""

    system: str
    users: list[str]
    replies: list[str] = field(default_factory=list)

    @staticmethod
    def make(seed: int, args: argparse.Namespace) -> Chat:
        rng = random.Random(seed)
        first = f"Here is my question. {words(rng, args.first_user_words)}?"
        rest = [f"And then? {words(rng, args.user_words)}?" for _ in range(args.turns - 1)]
        return Chat(f"You are a helpful assistant. {words(rng, args.system_words)}.", [first, *rest])

    def messages(self, turn: int) -> list[dict[str, str]]:
        """The whole conversation as turn `turn` (0-based) sends it."""
        out = [{"role": "system", "content": self.system}]
        for k in range(turn + 1):
            out.append({"role": "user", "content": self.users[k]})
            if k < turn:
                out.append({"role": "assistant", "content": self.replies[k]})
        return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def distinct_blocks(contexts: list[list[int]]) -> int:
    """Distinct full-block prefixes over `contexts` (what a block-hash cache holding them all names)."""
    seen: set[int] = set()
    for ids in contexts:
        h = 0
        for b in range(len(ids) // BLOCK):
            h = hash((h, tuple(ids[b * BLOCK : (b + 1) * BLOCK])))
            seen.add(h)
    return len(seen)


# --------------------------------------------------------------------------------------------- engines


def load(model: str, args: argparse.Namespace, *, caching: bool, num_snapshots: int = 0) -> LLM:
    """`model` with prefix caching on or off (4 sequences at most, `--cache-memory` GiB of cache)."""
    cfg = EngineConfig(
        max_num_seqs=4,
        max_model_len=args.max_model_len,
        cache_memory_gib=args.cache_memory,
        enable_prefix_caching=caching,
        num_state_snapshots=num_snapshots,
    )
    if model == "smollm2":
        return LLM(None, cpu=True, engine_config=cfg)
    return LLM(checkpoint(model), cpu=True, engine_config=cfg, quantize=args.hybrid_quantize)


def fresh_engine(llm: LLM, **changes: Any) -> None:
    """A new engine (an empty prefix cache; the current engine's EngineConfig with `changes`) over the same
    loaded model and pools: the old engine must be idle; its cached blocks and snapshots go with it."""
    llm.engine = LLMEngine(llm.runner, llm.tokenizer, replace(llm.engine.cfg, **changes))


@dataclass
class Turn:
    """One request as the engine served it."""

    prompt_tokens: int
    ttft: float  # seconds
    cached_tokens: int
    output_ids: list[int]
    text: str


def serve_one(llm: LLM, ids: list[int], params: SamplingParams) -> Turn:
    """Run one request alone to completion; TTFT from add_request to its first token."""
    rid = uuid.uuid4().hex
    engine = llm.engine
    t0 = time.perf_counter()
    engine.add_request(rid, ids, params)
    first = None
    out: list[int] = []
    text, cached = "", 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id != rid:
                continue
            if first is None and o.token_ids:
                first = time.perf_counter()
            out += o.token_ids
            text += o.text
            cached = max(cached, o.num_cached_tokens)
    assert first is not None, "the request produced no token"
    return Turn(len(ids), first - t0, cached, out, text)


def warm(llm: LLM) -> None:
    rng = random.Random(12345)
    llm.generate(words(rng, 300), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))


def snapshot_bytes(llm: LLM) -> int:
    """Bytes one Mamba2 state snapshot takes (0 for a model without recurrent layers)."""
    return cache_layout(llm.config).state_bytes_per_sequence(llm.dtype)


def chat_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=args.reply_tokens)


# ----------------------------------------------------------------------------------------- part 1: chat


def chat_part(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Turns 1..T on the cache-off and cache-on engines, alternating, over --rounds new conversations."""
    log(f"# chat: loading {model} twice (prefix cache off / on)")
    engines = {
        "off": load(model, args, caching=False),
        "on": load(model, args, caching=True, num_snapshots=args.snapshots),
    }
    for llm in engines.values():
        warm(llm)
    on = engines["on"]
    queries0, hits0 = on.engine.prefix_cache_queries, on.engine.prefix_cache_hits
    snapshots0 = on.engine.cache.num_snapshots  # the warm-up's
    params = chat_params(args)
    rounds: list[list[dict[str, Any]]] = []
    contexts: list[list[int]] = []  # every prompt + reply the cache-on engine saw (distinct prefixes held)
    for r in range(args.rounds):
        chat = Chat.make(1000 + r, args)
        prev: list[int] = []
        rows = []
        for turn in range(args.turns):
            ids = on.tokenizer.encode_chat(chat.messages(turn))
            names = ("off", "on") if (r + turn) % 2 == 0 else ("on", "off")
            got = {name: serve_one(engines[name], ids, params) for name in names}
            off_turn, on_turn = got["off"], got["on"]
            rows.append(
                {
                    "turn": turn + 1,
                    "prompt_tokens": len(ids),
                    "shared_tokens": common_prefix(ids, prev),
                    "ttft_off": off_turn.ttft,
                    "ttft_on": on_turn.ttft,
                    "cached_tokens": on_turn.cached_tokens,
                    "same_reply": off_turn.output_ids == on_turn.output_ids,
                }
            )
            prev = ids + off_turn.output_ids
            contexts.append(ids + on_turn.output_ids)
            chat.replies.append(off_turn.text)
        log(
            f"  round {r + 1}/{args.rounds}: "
            + ", ".join(f"{x['ttft_off']:.2f}/{x['ttft_on']:.2f}s" for x in rows)
        )
        rounds.append(rows)
    queries = on.engine.prefix_cache_queries - queries0
    hits = on.engine.prefix_cache_hits - hits0
    num_snapshots = on.engine.cache.num_snapshots - snapshots0
    held_tokens = distinct_blocks(contexts) * BLOCK
    result = {
        "model": model,
        "rounds": rounds,
        "turns": [_median_turn([rows[t] for rows in rounds]) for t in range(args.turns)],
        "engine_hit_rate": hits / max(1, queries),
        "snapshots_held": num_snapshots,
        "snapshot_bytes": snapshot_bytes(on),
        "held_prefix_tokens": held_tokens,
        "kv_bytes_per_token": cache_layout(on.config).bytes_per_token(on.dtype, on.kv_dtype),
        "cache_plan": on.runner.cache_plan.describe(),
    }
    del engines, on
    gc.collect()
    return result


def _median_turn(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"turn": rows[0]["turn"]}
    for k in ("prompt_tokens", "shared_tokens", "cached_tokens", "ttft_off", "ttft_on"):
        out[k] = statistics.median(x[k] for x in rows)
    out["speedup"] = out["ttft_off"] / out["ttft_on"]
    out["spread_off"] = spread([x["ttft_off"] for x in rows])
    out["spread_on"] = spread([x["ttft_on"] for x in rows])
    out["same_reply"] = sum(x["same_reply"] for x in rows)
    return out


def md_row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_head(*names: str) -> list[str]:
    return [md_row(*names), "|" + "---:|" * len(names)]


def chat_table(res: dict[str, Any], args: argparse.Namespace) -> str:
    lines = md_head(
        "turn",
        "prompt tokens",
        "shared tokens",
        "TTFT off ms",
        "TTFT on ms",
        "speed-up",
        "cached tokens",
        "hit %",
    )
    for t in res["turns"]:
        lines.append(
            md_row(
                t["turn"],
                f"{t['prompt_tokens']:.0f}",
                f"{t['shared_tokens']:.0f}",
                f"{1000 * t['ttft_off']:.0f}",
                f"{1000 * t['ttft_on']:.0f}",
                f"{t['speedup']:.1f}×",
                f"{t['cached_tokens']:.0f}",
                f"{100 * t['cached_tokens'] / t['prompt_tokens']:.1f}",
            )
        )
    later = res["turns"][1:]
    cached = sum(t["cached_tokens"] for t in later)
    prompt = max(1, sum(t["prompt_tokens"] for t in later))
    shared = sum(t["shared_tokens"] for t in later)
    speedups = [t["speedup"] for t in later] or [0.0]
    same = sum(t["same_reply"] for t in res["turns"])
    worst = max(max(t["spread_off"], t["spread_on"]) for t in res["turns"])
    lines += [
        "",
        f"Turns 2..{args.turns}: hit rate {100 * cached / prompt:.1f}% of prompt tokens (shared "
        f"{100 * shared / prompt:.1f}%); TTFT speed-up {min(speedups):.1f}× – {max(speedups):.1f}× (target "
        f"≥ 5×). Engine counters over all turns and rounds: {100 * res['engine_hit_rate']:.1f}% of the "
        f"prompt tokens looked up were cached. Greedy replies cache on == off in {same} of "
        f"{args.turns * args.rounds} turns. TTFT spread over rounds ≤ {100 * worst:.0f}%.",
    ]
    if res["snapshot_bytes"]:
        held = res["snapshots_held"] * res["snapshot_bytes"]
        per_token = held / max(1, res["held_prefix_tokens"])
        lines.append(
            f"Snapshots: {res['snapshots_held']} held × {res['snapshot_bytes'] / MiB:.1f} MiB = "
            f"{held / MiB:.0f} MiB for {res['held_prefix_tokens']} distinct cached prefix tokens: "
            f"{per_token / 1024:.0f} KiB per cached token (the KV cache: "
            f"{res['kv_bytes_per_token'] / 1024:.1f} KiB per token). Cache: {res['cache_plan']}."
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- part 2: sweep


def sweep_part(args: argparse.Namespace) -> dict[str, Any]:
    """Snapshot interval vs hit rate and snapshot memory, workloads A (chat) and B (shared system prompts).
    --sweep-rounds passes over the intervals and a cache-off reference (the first pass fixes the chat's
    replies), the order reversed every other pass; hit rates and counts come out the same every pass, the
    times are medians."""
    log(f"# sweep: loading {HYBRID} (prefix cache on, {args.snapshots} snapshot slots)")
    llm = load(HYBRID, args, caching=True, num_snapshots=args.snapshots)
    warm(llm)
    chat, groups = Chat.make(2000, args), _groups(args)
    configs: list[int | None] = [None, *args.intervals]  # None: the cache off
    passes: dict[int | None, list[dict[str, Any]]] = {k: [] for k in configs}
    for r in range(args.sweep_rounds):
        for k in configs if r % 2 == 0 else configs[::-1]:
            log(
                f"  pass {r + 1}/{args.sweep_rounds}: "
                + ("cache off" if k is None else f"interval {k} blocks")
            )
            if k is None:
                fresh_engine(llm, enable_prefix_caching=False)
            else:
                fresh_engine(llm, enable_prefix_caching=True, state_snapshot_interval=k)
            passes[k].append({"chat": _sweep_chat(llm, chat, args), "sp": _sweep_prompts(llm, groups)})
    merged = {k: _median_pass(p) for k, p in passes.items()}
    out = {
        "snapshot_bytes": snapshot_bytes(llm),
        "reference": merged[None],
        "groups": [(len(llm.tokenizer.encode(s)), len(u)) for s, u in groups],
        "results": [{"interval": k, **merged[k]} for k in args.intervals],
        "passes": {str(k): p for k, p in passes.items()},
    }
    del llm
    gc.collect()
    return out


def _median_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration over passes: the first pass's counts, the median of each time."""
    out = {}
    for workload, first in passes[0].items():
        out[workload] = {
            key: statistics.median(p[workload][key] for p in passes) if key.startswith("ttft") else value
            for key, value in first.items()
        }
    return out


def _sweep_chat(llm: LLM, chat: Chat, args: argparse.Namespace) -> dict[str, Any]:
    """Workload A on the current engine: the chat's turns one after another (its replies appended to `chat`
    on the first pass, replayed after). Hit rates count turns 2.. only."""
    turns, contexts, shared = [], [], 0
    for turn in range(args.turns):
        ids = llm.tokenizer.encode_chat(chat.messages(turn))
        if contexts:  # what a cache cutting at any block boundary could serve
            shared += min(common_prefix(ids, contexts[-1]), len(ids) - 1) // BLOCK * BLOCK
        turns.append(serve_one(llm, ids, chat_params(args)))
        contexts.append(ids + turns[-1].output_ids)
        if len(chat.replies) == turn:
            chat.replies.append(turns[-1].text)
    prompt = sum(t.prompt_tokens for t in turns[1:])
    return {
        "hit": sum(t.cached_tokens for t in turns[1:]) / prompt,
        "ideal": shared / prompt,
        "snapshots": llm.engine.cache.num_snapshots,
        "tokens": distinct_blocks(contexts) * BLOCK,
        "ttft_first": turns[0].ttft,
        "ttft_later": statistics.mean(t.ttft for t in turns[1:]),
    }


def _sweep_prompts(llm: LLM, groups: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """Workload B: per group a fresh engine, the group's requests one after another (max_tokens 1). Hit
    rates count all requests; TTFT the requests after a group's first (the ones that can hit)."""
    num_prompt = num_cached = num_shared = num_snapshots = num_tokens = 0
    ttft = []
    for system, users in groups:
        fresh_engine(llm)
        seen: list[list[int]] = []
        for user in users:
            ids = llm.tokenizer.encode_chat(
                [{"role": "system", "content": system}, {"role": "user", "content": user}]
            )
            done = serve_one(llm, ids, SamplingParams(temperature=0, max_tokens=1))
            shared = max((common_prefix(ids, s) for s in seen), default=0)
            num_shared += min(shared, len(ids) - 1) // BLOCK * BLOCK
            num_prompt += len(ids)
            num_cached += done.cached_tokens
            if seen:
                ttft.append(done.ttft)
            seen.append(ids)
        num_snapshots += llm.engine.cache.num_snapshots
        num_tokens += distinct_blocks(seen) * BLOCK
    return {
        "hit": num_cached / num_prompt,
        "ideal": num_shared / num_prompt,
        "snapshots": num_snapshots,
        "tokens": num_tokens,
        "ttft_hits": statistics.mean(ttft),
    }


def _groups(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    rng = random.Random(3000)
    out = []
    for _ in range(args.groups):
        system = f"You are a helpful assistant. {words(rng, rng.randint(args.sp_min, args.sp_max))}."
        users = [words(rng, rng.randint(20, 80)) for _ in range(args.group_size)]
        out.append((system, users))
    return out


def sweep_table(res: dict[str, Any], args: argparse.Namespace) -> str:
    size = res["snapshot_bytes"]
    lines = md_head(
        "interval (blocks)",
        "chat hit % (ideal)",
        "chat snapshots",
        "chat MiB",
        "KiB / cached token",
        "chat TTFT turn 1 / 2.. ms",
        "SP hit % (ideal)",
        "SP snapshots",
        "SP MiB",
        "KiB / cached token",
        "SP TTFT of hits ms",
    )
    for r in res["results"]:
        chat, sp = r["chat"], r["sp"]
        chat_bytes, sp_bytes = chat["snapshots"] * size, sp["snapshots"] * size
        lines.append(
            md_row(
                r["interval"],
                f"{100 * chat['hit']:.1f} ({100 * chat['ideal']:.1f})",
                chat["snapshots"],
                f"{chat_bytes / MiB:.0f}",
                f"{chat_bytes / max(1, chat['tokens']) / 1024:.0f}",
                f"{1000 * chat['ttft_first']:.0f} / {1000 * chat['ttft_later']:.0f}",
                f"{100 * sp['hit']:.1f} ({100 * sp['ideal']:.1f})",
                sp["snapshots"],
                f"{sp_bytes / MiB:.0f}",
                f"{sp_bytes / max(1, sp['tokens']) / 1024:.0f}",
                f"{1000 * sp['ttft_hits']:.0f}",
            )
        )
    ref = res["reference"]
    lengths = ", ".join(str(n) for n, _ in res["groups"])
    lines += [
        "",
        f"One snapshot = {size / MiB:.1f} MiB. Cache off, same requests: chat TTFT turn 1 "
        f"{1000 * ref['chat']['ttft_first']:.0f} ms, turns 2.. {1000 * ref['chat']['ttft_later']:.0f} ms; "
        f"SP TTFT {1000 * ref['sp']['ttft_hits']:.0f} ms. System prompts (SP) of {lengths} tokens, "
        f"{args.group_size} user messages each (20–80 words); SP hit rates over all requests (a group's "
        "first can not hit).",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- part 3: serve


def serve_part(args: argparse.Namespace) -> dict[str, Any]:
    """`blazr bench` with a shared system prompt against blazr serve, prefix cache on vs off, alternating."""
    gguf = embedded_gguf()
    base = [sys.executable, "-m", "blazr", "serve", "--model", str(gguf), "--cpu", "--host", "127.0.0.1"]
    base += ["--max-num-seqs", "16", "--num-threads", str(args.threads), "--max-model-len", "4096"]
    base += ["--cache-memory", str(args.cache_memory)]
    servers = []
    out_dir = Path(tempfile.mkdtemp(prefix="blazr-prefix-bench-"))
    runs: dict[str, list[list[dict[str, Any]]]] = {"off": [], "on": []}
    try:
        for name, extra in (("off", ["--no-prefix-cache"]), ("on", [])):
            log(f"# serve: starting blazr serve (prefix cache {name})")
            port = free_port()
            servers.append(Server(f"blazr-{name}", [*base, *extra, "--port", str(port)], port))
            servers[-1].wait_ready()
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for server in order:
                name = server.name.removeprefix("blazr-")
                log(f"  round {r + 1}/{args.rounds}: {server.name} …")
                runs[name].append(_bench(server.url, args, 2000 + r, out_dir / f"{name}-{r}.json"))
    finally:
        for server in servers:
            server.stop()
    medians = {
        name: [_median_level([run[i] for run in rs]) for i in range(len(rs[0]))] for name, rs in runs.items()
    }
    return {**medians, "rounds": runs}


def _bench(url: str, args: argparse.Namespace, seed: int, out: Path) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "blazr", "bench", "--base-url", url, "--concurrency", "1,4,16"]
    cmd += ["--num-prompts", str(args.bench_prompts), "--input-len", str(args.bench_input)]
    cmd += ["--shared-prefix-len", str(args.bench_shared), "--output-len", str(args.bench_output)]
    cmd += ["--seed", str(seed), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"blazr bench failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return json.loads(out.read_text())["results"]


def _median_level(levels: list[dict[str, Any]]) -> dict[str, Any]:
    out = {
        k: statistics.median(x[k] for x in levels)
        for k in ("median_ttft_ms", "mean_ttft_ms", "output_throughput")
    }
    cached = [
        x["total_cached_tokens"] / max(1, x["total_input_tokens"])
        for x in levels
        if x["total_cached_tokens"] is not None
    ]
    out["cached_share"] = statistics.median(cached) if cached else None
    out["concurrency"] = levels[0]["concurrency"]
    out["failed"] = sum(x["failed"] for x in levels)
    out["spread_ttft"] = spread([x["median_ttft_ms"] for x in levels])
    return out


def serve_table(res: dict[str, Any]) -> str:
    lines = md_head(
        "concurrency",
        "TTFT p50 off ms",
        "TTFT p50 on ms",
        "TTFT ×",
        "TTFT mean off / on ms",
        "out tok/s off",
        "out tok/s on",
        "tok/s ×",
        "cached (on)",
    )
    for off, on in zip(res["off"], res["on"], strict=True):
        cached = "–" if on["cached_share"] is None else f"{100 * on['cached_share']:.1f}%"
        lines.append(
            md_row(
                off["concurrency"],
                f"{off['median_ttft_ms']:.0f}",
                f"{on['median_ttft_ms']:.0f}",
                f"{off['median_ttft_ms'] / on['median_ttft_ms']:.1f}×",
                f"{off['mean_ttft_ms']:.0f} / {on['mean_ttft_ms']:.0f}",
                f"{off['output_throughput']:.1f}",
                f"{on['output_throughput']:.1f}",
                f"{on['output_throughput'] / off['output_throughput']:.2f}×",
                cached,
            )
        )
    levels = res["off"] + res["on"]
    failed = sum(x["failed"] for x in levels)
    worst = max(x["spread_ttft"] for x in levels)
    lines += ["", f"Failed requests: {failed}. TTFT p50 spread over rounds ≤ {100 * worst:.0f}%."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--system-words", type=int, default=1300)
    ap.add_argument("--first-user-words", type=int, default=150)
    ap.add_argument("--user-words", type=int, default=60)
    ap.add_argument("--reply-tokens", type=int, default=64, help="max_tokens of each reply (greedy)")
    ap.add_argument("--hybrid-quantize", default="int8", help="--quantize of the hybrid (default int8)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--cache-memory", type=float, default=4.0, help="GiB of cache per engine")
    ap.add_argument("--intervals", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16])
    ap.add_argument(
        "--snapshots",
        type=int,
        default=160,
        help="snapshot slots of the hybrid's cache-on engines (none evicted)",
    )
    ap.add_argument("--sweep-rounds", type=int, default=3, help="passes over the intervals (time medians)")
    ap.add_argument("--groups", type=int, default=6, help="shared system prompts in sweep workload B")
    ap.add_argument("--group-size", type=int, default=4, help="user messages per system prompt")
    ap.add_argument("--sp-min", type=int, default=100)
    ap.add_argument("--sp-max", type=int, default=1200)
    ap.add_argument("--bench-shared", type=int, default=1000, help="shared prefix words in part 3")
    ap.add_argument("--bench-input", type=int, default=100, help="words after the shared prefix in part 3")
    ap.add_argument("--bench-output", type=int, default=32)
    ap.add_argument("--bench-prompts", type=int, default=16, help="requests per concurrency level")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--json", type=Path, default=None, help="write the raw results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    parts = args.parts.split(",")
    print("# Prefix caching: multi-turn chat, snapshot interval, server\n")
    print(f"- machine: {host_line()}\n- versions: {versions()}\n- threads: {args.threads}\n")
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if "chat" in parts:
        for model in args.models.split(","):
            res = chat_part(model, args)
            results[f"chat-{model}"] = res
            print(f"### Multi-turn chat, {model}: TTFT with the prefix cache off vs on\n")
            print(
                f"System prompt {args.system_words} words, first user message {args.first_user_words}, then "
                f"{args.user_words} per turn, replies ≤ {args.reply_tokens} greedy tokens; medians of "
                f"{args.rounds} rounds (new conversation each).\n"
            )
            print(chat_table(res, args) + "\n", flush=True)
    if "sweep" in parts:
        res = sweep_part(args)
        results["sweep"] = res
        print(f"### {HYBRID}: state snapshot interval vs hit rate and memory\n")
        print(sweep_table(res, args) + "\n", flush=True)
    if "serve" in parts:
        res = serve_part(args)
        results["serve"] = res
        print("### `blazr bench` against `blazr serve` (SmolLM2), shared system prompt, cache off vs on\n")
        print(
            f"{args.bench_shared} shared words + {args.bench_input} words per prompt, {args.bench_output} "
            f"tokens out, {args.bench_prompts} requests per level; medians of {args.rounds} alternating "
            "rounds.\n"
        )
        print(serve_table(res) + "\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
