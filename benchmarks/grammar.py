"""Constrained decoding: llguidance vs xgrammar on this CPU, with blazr's own tokenizer (SmolLM2-135M).

    python benchmarks/grammar.py [--repeats 5] [--max-tokens 96] [--batch 8] [--skip-e2e]

Both libraries are built from the same token bytes (`Tokenizer.token_bytes`, control tokens marked special),
never from a `transformers` tokenizer. Printed side by side:

1. tokenizer build time (once per model);
2. compile time per JSON schema, to a matcher with its first mask (median of --repeats, caches off;
   llguidance builds its lexer lazily, xgrammar precomputes masks for the whole vocabulary);
3. per-token cost during a greedy constrained generation on SmolLM2 (the engine's sampler is wrapped: fill
   the library's bitmask, apply it with blazr's `apply_token_bitmask`, sample, advance): median and p99 µs
   per token; each output is checked with `json.loads` + `jsonschema`;
4. coverage: for each feature, does the library compile it, accept a valid instance and reject an invalid
   one (its tokens fed through the matcher);
5. (unless --skip-e2e) blazr's own integration: decode tok/s with a JSON schema vs free (as many tokens),
   one stream per schema and --batch streams at once.

The two libraries alternate inside every measurement loop so that a busy neighbour on the VM hits both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jsonschema
import llguidance
import xgrammar

import blazr.engine.engine as engine_module
from blazr import LLM, SamplingParams
from blazr.engine.grammar import (
    GrammarMatcher,
    StructuredOutput,
    apply_token_bitmask,
    build_ll_tokenizer,
    words,
)
from blazr.engine.json_schema import JSON_OPTIONS
from blazr.tokenizer import Tokenizer

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                        "required": ["city", "zip"],
                    },
                },
                "required": ["id", "email", "address"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "arrays+enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
            "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 10}},
        },
        "required": ["color", "tags", "scores"],
    },
    "anyOf+nulls": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "rating": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5}, {"type": "null"}]},
            "kind": {"type": "string", "enum": ["book", "film", "game"]},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
            "authors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"first": {"type": "string"}, "last": {"type": "string"}},
                    "required": ["first", "last"],
                },
                "maxItems": 2,
            },
        },
        "required": ["title", "rating", "kind", "year", "authors"],
    },
}
PROMPT = "Reply with a JSON object that follows this JSON schema:\n{schema}"

# (feature, kind, spec, a valid output, an invalid output)
COVERAGE: list[tuple[str, str, Any, str, str]] = [
    (
        "nested objects",
        "json",
        SCHEMAS["nested"],
        '{"user": {"id": 1, "email": "a@b.com", "address": {"city": "X", "zip": "1"}}, "active": true}',
        '{"user": {"id": 1}, "active": true}',
    ),
    (
        "array min/maxItems",
        "json",
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
        "[1, 2]",
        "[1, 2, 3]",
    ),
    ("enum", "json", {"enum": ["a", "b"]}, '"a"', '"c"'),
    (
        "required",
        "json",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        '{"a": 1}',
        "{}",
    ),
    ("number bounds", "json", {"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "0.5", "1"),
    ("integer bounds", "json", {"type": "integer", "minimum": 10, "maximum": 20}, "15", "25"),
    ("string pattern", "json", {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}, '"AB123"', '"ab123"'),
    ("string min/maxLength", "json", {"type": "string", "minLength": 2, "maxLength": 3}, '"abc"', '"abcd"'),
    ("format: date", "json", {"type": "string", "format": "date"}, '"2024-01-31"', '"31/01/2024"'),
    ("anyOf + null", "json", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "null", '"x"'),
    ("oneOf", "json", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, "true", '"x"'),
    (
        "$ref / $defs",
        "json",
        {
            "$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
            "type": "array",
            "items": {"$ref": "#/$defs/p"},
        },
        '[{"x": 1}]',
        '[{"y": 1}]',
    ),
    ("const", "json", {"const": "yes"}, '"yes"', '"no"'),
    (
        "additionalProperties: false",
        "json",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        '{"a": 1}',
        '{"a": 1, "b": 2}',
    ),
    (
        "strict (no extra keys)",
        "json_strict",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        '{"a": 1}',
        '{"a": 1, "b": 2}',
    ),
    ("json_object (any object)", "json", {"type": "object"}, '{"k": [1, {"z": null}]}', "[1]"),
    ("regex", "regex", r"\d{3}-[a-z]+", "123-abc", "12-abc"),
    ("choice", "choice", ["yes", "no", "maybe"], "maybe", "perhaps"),
    ("Lark grammar", "lark", 'start: expr\nexpr: NUMBER ("+" NUMBER)*\nNUMBER: /[0-9]+/', "1+22+3", "1++2"),
    ("GBNF/EBNF grammar", "ebnf", 'root ::= "(" [a-z]+ ")"', "(abc)", "(ABC)"),
]


def control_ids(tok: Tokenizer) -> list[int]:
    return sorted(i for i in tok.special_tokens.values() if tok.decode([i], skip_special=True) == "")


# --------------------------------------------------------------------------------------------- backends


class Backend:
    """What the engine needs from a grammar library: compile, a matcher, its mask, advance."""

    name = ""

    def compile(self, kind: str, spec: Any) -> Any: ...
    def new_matcher(self, compiled: Any) -> Any: ...
    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None: ...
    def advance(self, matcher: Any, token: int) -> bool: ...


class Llg(Backend):
    """llguidance, its raw API (blazr's wrapper, engine/grammar.py, adds ~5 µs a row for its end tokens)."""

    name = "llguidance"

    def __init__(self, tok: Tokenizer, vocab_size: int, eos: int) -> None:
        self.tokenizer = build_ll_tokenizer(tok, vocab_size)

    def compile(self, kind: str, spec: Any) -> Any:
        M = llguidance.LLMatcher
        if kind in ("json", "json_strict"):
            options = dict(JSON_OPTIONS)
            if kind == "json_strict":
                spec = {**spec, "additionalProperties": False}
            return M.grammar_from_json_schema(spec, overrides=options)  # type: ignore[arg-type]
        if kind == "regex":
            return M.grammar_from_regex(spec)
        if kind == "choice":
            return M.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec))
        if kind == "lark":
            return M.grammar_from_lark(spec)
        if kind == "ebnf":
            return llguidance.grammar_from("gbnf", spec)
        raise ValueError(kind)

    def new_matcher(self, compiled: Any) -> Any:
        m = llguidance.LLMatcher(self.tokenizer, compiled, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        v = bitmask[row]
        matcher.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * 4)

    def advance(self, matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)


class Xgr(Backend):
    """xgrammar, built from the same bytes (control tokens empty: its RAW vocabulary then makes them special),
    compiling on both cores, caching off (every schema new, as an agent's tools are)."""

    name = "xgrammar"

    def __init__(self, tok: Tokenizer, vocab_size: int, eos: int) -> None:
        special = set(control_ids(tok))
        vocab = [b"" if i in special else tok.token_bytes(i) for i in range(tok.vocab_size)]
        info = xgrammar.TokenizerInfo(
            vocab, xgrammar.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=[eos]
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, kind: str, spec: Any) -> Any:
        c = self.compiler
        if kind in ("json", "json_strict"):
            strict = kind == "json_strict"
            return c.compile_json_schema(json.dumps(spec), any_whitespace=False, strict_mode=strict)
        if kind == "regex":
            return c.compile_regex(spec)
        if kind == "choice":
            return c.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in spec))
        if kind == "lark":
            return c.compile_lark(spec)
        if kind == "ebnf":
            return c.compile_grammar(spec)
        raise ValueError(kind)

    def new_matcher(self, compiled: Any) -> Any:
        return xgrammar.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def advance(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)


# ---------------------------------------------------------------------------------------------- helpers


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def chat(llm: LLM, schema: dict[str, Any]) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": PROMPT.format(schema=json.dumps(schema))}])


def accepts(backend: Backend, tok: Tokenizer, V: int, kind: str, spec: Any, text: str, eos: int) -> bool:
    """Whether the matcher takes `text`'s tokens and then allows EOS (the output is complete)."""
    m = backend.new_matcher(backend.compile(kind, spec))
    if not all(backend.advance(m, t) for t in tok.encode_ordinary(text)):
        return False
    mask = torch.zeros(1, words(V), dtype=torch.int32)
    backend.fill(m, mask, 0)
    return bool((mask[0, eos // 32] >> (eos % 32)) & 1)


# ------------------------------------------------------------------------------------------ measurements


def compile_times(backends: list[Backend], V: int, repeats: int) -> dict[tuple[str, str], float]:
    """Median seconds from a schema to a matcher with its first mask, per (schema, backend)."""
    out: dict[tuple[str, str], list[float]] = {}
    mask = torch.zeros(1, words(V), dtype=torch.int32)
    for name, schema in SCHEMAS.items():
        for _ in range(repeats):
            for b in backends:

                def build(b: Backend = b, schema: dict[str, Any] = schema) -> None:
                    b.fill(b.new_matcher(b.compile("json", schema)), mask, 0)

                out.setdefault((name, b.name), []).append(timed(build)[0])
    return {k: statistics.median(v) for k, v in out.items()}


def masked_generation(
    llm: LLM, backends: list[Backend], max_tokens: int, repeats: int
) -> dict[tuple[str, str], dict[str, Any]]:
    """Greedy generation per schema, each backend's mask applied in the engine's sampler (blazr's apply for
    both): per-token fill / advance / apply seconds, the output and whether it validates."""
    real_sample = engine_module.sample
    V = llm.config.vocab_size
    results: dict[tuple[str, str], dict[str, Any]] = {}
    current: dict[str, Any] = {}

    def wrapped(logits: torch.Tensor, rows: Any) -> Any:
        b: Backend = current["backend"]
        m, r = current["matcher"], current["record"]
        bitmask = torch.empty(1, words(V), dtype=torch.int32)
        t_fill, _ = timed(lambda: b.fill(m, bitmask, 0))
        logits = logits.clone()
        t_apply, _ = timed(lambda: apply_token_bitmask(logits, bitmask, [0]))
        result = real_sample(logits, rows)
        t_adv, ok = timed(lambda: b.advance(m, result.token_ids[0]))
        assert ok, f"{b.name} refused its own token {result.token_ids[0]}"
        r["fill"].append(t_fill)
        r["apply"].append(t_apply)
        r["advance"].append(t_adv)
        return result

    engine_module.sample = wrapped
    try:
        for name, schema in SCHEMAS.items():
            for _ in range(repeats):
                for b in backends:
                    r = results.setdefault((name, b.name), {"fill": [], "apply": [], "advance": []})
                    current.update(backend=b, matcher=b.new_matcher(b.compile("json", schema)), record=r)
                    params = SamplingParams(max_tokens=max_tokens, temperature=0)
                    c = llm.generate([chat(llm, schema)], params)[0].outputs[0]
                    r["text"], r["finish"], r["tokens"] = c.text, c.finish_reason, len(c.token_ids)
                    try:
                        jsonschema.validate(json.loads(c.text), schema)
                        r["valid"] = True
                    except (ValueError, jsonschema.ValidationError):
                        r["valid"] = False
    finally:
        engine_module.sample = real_sample
    return results


def coverage(backends: list[Backend], tok: Tokenizer, V: int, eos: int) -> dict[tuple[str, str], str]:
    out = {}
    for feature, kind, spec, good, bad in COVERAGE:
        for b in backends:
            try:
                ok_good = accepts(b, tok, V, kind, spec, good, eos)
                ok_bad = accepts(b, tok, V, kind, spec, bad, eos)
            except Exception as e:
                out[(feature, b.name)] = f"✗ ({type(e).__name__}: {str(e).splitlines()[0][:60]})"
                continue
            notes = ([] if ok_good else ["rejects a valid output"]) + (
                ["accepts an invalid one"] if ok_bad else []
            )
            out[(feature, b.name)] = "✓" if not notes else "✗ " + ", ".join(notes)
    return out


class Timers:
    """Seconds spent in the engine's `sample` (fill + apply + sampling) and in `GrammarMatcher.advance`,
    while installed: the grammar's cost per step, apart from the forward's noise on a shared machine."""

    def __init__(self) -> None:
        self.sample = 0.0
        self.advance = 0.0
        self.steps = 0

    def __enter__(self) -> Timers:
        self._sample, self._advance = engine_module.sample, GrammarMatcher.advance

        def sample(*args: Any) -> Any:
            t, out = timed(lambda: self._sample(*args))
            self.sample += t
            self.steps += 1
            return out

        def advance(matcher: GrammarMatcher, token: int) -> None:
            t, _ = timed(lambda: self._advance(matcher, token))
            self.advance += t

        engine_module.sample = sample
        GrammarMatcher.advance = advance  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        engine_module.sample = self._sample
        GrammarMatcher.advance = self._advance  # type: ignore[method-assign]


def decode_rate(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, list[int]]:
    """Output tok/s once every request has its first token (decode only), and the tokens each made."""
    engine = llm.engine
    rids = [f"bench-{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for rid, p, sp in zip(rids, prompts, params, strict=True):
        engine.add_request(rid, p, sp)
    counts = dict.fromkeys(rids, 0)
    start, n = None, 0
    while engine.has_unfinished():
        outs = engine.step()
        for o in outs:
            counts[o.request_id] += len(o.token_ids)
            if start is not None:
                n += len(o.token_ids)
        if start is None and all(counts.values()):
            start = time.perf_counter()
    elapsed = time.perf_counter() - start if start is not None else 0.0
    return (n / elapsed if elapsed > 0 else 0.0), [counts[r] for r in rids]


def end_to_end(llm: LLM, max_tokens: int, repeats: int, batch: int) -> list[tuple[str, float, float, float]]:
    """blazr's own constrained decoding vs free decoding of as many tokens (ignore_eos), alternated: decode
    tok/s of one stream per schema, and of `batch` streams (every schema, cycled) at once; and the time the
    grammar adds to a step (sampling with masks + advancing, minus sampling free), ms."""
    rows = []
    cases = [(name, [chat(llm, schema)], [schema]) for name, schema in SCHEMAS.items()]
    schemas = list(SCHEMAS.values())
    mixed = [schemas[i % len(schemas)] for i in range(batch)]
    cases.append((f"{batch} streams, all schemas", [chat(llm, s) for s in mixed], mixed))
    for name, prompts, specs in cases:
        json_params = [
            SamplingParams(max_tokens=max_tokens, temperature=0, structured=StructuredOutput(json_schema=s))
            for s in specs
        ]
        rates: dict[str, list[float]] = {"free": [], "json": []}
        decode_rate(llm, prompts, json_params)  # warm: compile, first masks
        json_t, free_t = Timers(), Timers()
        for _ in range(repeats):
            with json_t:
                rate, counts = decode_rate(llm, prompts, json_params)
            rates["json"].append(rate)
            free_params = [SamplingParams(max_tokens=c, temperature=0, ignore_eos=True) for c in counts]
            with free_t:
                rates["free"].append(decode_rate(llm, prompts, free_params)[0])
        added = (json_t.sample + json_t.advance) / json_t.steps - free_t.sample / free_t.steps
        rows.append((name, statistics.median(rates["free"]), statistics.median(rates["json"]), added * 1e3))
    return rows


def compare(llm: LLM, args: argparse.Namespace) -> None:
    """Sections 1–4: the two libraries side by side."""
    tok = llm.tokenizer
    V = llm.config.vocab_size
    eos = min(tok.eos_token_ids)
    build: dict[str, list[float]] = {"llguidance": [], "xgrammar": []}
    backends: list[Backend] = []
    for _ in range(3):
        backends = []
        for cls in (Llg, Xgr):
            t, b = timed(lambda cls=cls: cls(tok, V, eos))
            build[b.name].append(t)
            backends.append(b)
    names = [b.name for b in backends]
    print("\n| | " + " | ".join(names) + " |\n|---|---|---|")
    cells = " | ".join(f"{statistics.median(build[n]) * 1e3:.0f}" for n in names)
    print(f"| tokenizer build (ms) | {cells} |")

    ct = compile_times(backends, V, args.repeats)
    print("\nCompile time per JSON schema, to a matcher with its first mask (ms, median)\n")
    print("| schema | " + " | ".join(names) + " |\n|---|---|---|")
    for s in SCHEMAS:
        print(f"| {s} | " + " | ".join(f"{ct[(s, n)] * 1e3:.2f}" for n in names) + " |")

    gen = masked_generation(llm, backends, args.max_tokens, max(1, args.repeats // 2))
    print("\nPer token of a greedy constrained generation, µs median / p99: the library's mask fill and")
    print("advance; apply = blazr's bitmask apply (the same for both)\n")
    header = " | ".join(f"{n} fill | {n} advance" for n in names)
    print(f"| schema | tokens | {header} | apply | valid |")
    print("|---|---|" + "---|---|" * len(names) + "---|---|")
    for s in SCHEMAS:
        cells = []
        for n in names:
            r = gen[(s, n)]
            for k in ("fill", "advance"):
                cells.append(f"{pct(r[k], 0.5) * 1e6:.0f} / {pct(r[k], 0.99) * 1e6:.0f}")
        apply = gen[(s, names[0])]["apply"] + gen[(s, names[1])]["apply"]
        toks = " / ".join(str(gen[(s, n)]["tokens"]) for n in names)
        valid = " / ".join("✓" if gen[(s, n)]["valid"] else "✗" for n in names)
        print(f"| {s} | {toks} | " + " | ".join(cells) + f" | {pct(apply, 0.5) * 1e6:.0f} | {valid} |")
    print()
    for s in SCHEMAS:
        for n in names:
            print(f"    {s:>12} {n:>10}: {gen[(s, n)]['text']!r} ({gen[(s, n)]['finish']})")

    cov = coverage(backends, tok, V, eos)
    print("\nCoverage (compiles, accepts a valid output, rejects an invalid one)\n")
    print("| feature | " + " | ".join(names) + " |\n|---|---|---|")
    for feature, *_ in COVERAGE:
        print(f"| {feature} | " + " | ".join(cov[(feature, n)] for n in names) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--only-e2e", action="store_true")
    args = ap.parse_args()
    llm = LLM(cpu=True)
    V = llm.config.vocab_size
    print(
        f"model {llm.name}, vocab {V}, torch threads {torch.get_num_threads()}, "
        f"llguidance {version('llguidance')}, xgrammar {version('xgrammar')}"
    )

    if not args.only_e2e:
        compare(llm, args)

    if not args.skip_e2e:
        rows = end_to_end(llm, args.max_tokens, args.repeats, args.batch)
        print("\nblazr's integration (llguidance): decode tok/s after the first token, greedy, free vs JSON")
        print("schema (the free run makes as many tokens, ignore_eos; medians, alternated)\n")
        print("| streams | free | json_schema | slower by | grammar per step (ms) | step (ms) | share |")
        print("|---|---|---|---|---|---|---|")
        for name, free, js, added in rows:
            streams = args.batch if "streams" in name else 1
            step = streams / free * 1e3
            print(
                f"| {name} | {free:.1f} | {js:.1f} | {(1 - js / free) * 100:.1f}% | {added:.3f} | {step:.1f} "
                f"| {added / step * 100:.1f}% |"
            )


if __name__ == "__main__":
    main()
