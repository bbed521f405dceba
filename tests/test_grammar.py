"""Constrained decoding (engine/grammar.py) on the embedded SmolLM2: every output of a JSON schema parses and
validates (greedy and sampled), regex / choice / Lark / GBNF outputs match, free rows beside constrained ones
get exactly their tokens alone, a preempted constrained sequence continues where it was, and bad specs are a
one-line BlazrError. The bitmask fast path is tied to its plain-PyTorch reference."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.config import EngineConfig
from blazr.engine.grammar import (
    StructuredOutput,
    ThinkFirst,
    apply_token_bitmask,
    apply_token_bitmask_reference,
    words,
)
from blazr.engine.json_schema import lark_json, narrow_schema
from blazr.errors import BlazrError

NAME = {"type": "string", "maxLength": 16}
SCHEMAS: dict[str, dict] = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    "nested objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "address": {
                        "type": "object",
                        "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"],
                    },
                },
                "required": ["id", "address"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "array min/max items": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", "XL"]}},
        "required": ["color", "size"],
    },
    "required and optional": {
        "type": "object",
        "properties": {
            "title": NAME,
            "subtitle": NAME,
            "pages": {"type": "integer", "minimum": 1, "maximum": 999},
        },
        "required": ["title"],
    },
    "number bounds": {
        "type": "object",
        "properties": {
            # multipleOf keeps the decimals (and a sampled output) short; binary-exact, for jsonschema
            "celsius": {"type": "number", "minimum": -50, "maximum": 50, "multipleOf": 0.5},
            "humidity": {"type": "integer", "minimum": 0, "maximum": 100},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1, "multipleOf": 0.25},
        },
        "required": ["celsius", "humidity", "ratio"],
    },
    "string patterns": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
            "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
        },
        "required": ["code", "date"],
    },
    "booleans": {
        "type": "object",
        "properties": {"is_open": {"type": "boolean"}, "has_wifi": {"type": "boolean"}},
        "required": ["is_open", "has_wifi"],
    },
    "nulls and anyOf": {
        "type": "object",
        "properties": {
            "rating": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5}, {"type": "null"}]},
            "note": {"anyOf": [NAME, {"type": "null"}]},
        },
        "required": ["rating", "note"],
    },
    "array of objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 10}},
                    "required": ["name", "qty"],
                },
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["items"],
    },
    "const and $ref": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 99},
                    "y": {"$ref": "#/$defs/c"},
                },
                "required": ["x", "y"],
            },
            "c": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "type": "object",
        "properties": {
            "kind": {"const": "segment"},
            "start": {"$ref": "#/$defs/point"},
            "end": {"$ref": "#/$defs/point"},
        },
        "required": ["kind", "start", "end"],
    },
    "top-level array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2,
        "maxItems": 4,
    },
}
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(cpu=True, max_num_seqs=32, max_model_len=1024)


def chat(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def schema_prompt(llm: LLM, name: str) -> list[int]:
    return chat(llm, f"Write a JSON value ({name}) for this schema:\n{json.dumps(SCHEMAS[name])}")


def constrained(spec: StructuredOutput, **kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": MAX_TOKENS, "temperature": 0.0, "structured": spec, **kw})


# --------------------------------------------------------------------------------------- JSON schema


@pytest.fixture(scope="module")
def schema_outputs(llm):
    """Every schema greedy and sampled (3 seeded samples each, n=3: a matcher each), in one batch."""
    names = list(SCHEMAS)
    prompts = [schema_prompt(llm, n) for n in names] * 2
    params = [constrained(StructuredOutput(json_schema=SCHEMAS[n])) for n in names] + [
        constrained(StructuredOutput(json_schema=SCHEMAS[n]), temperature=0.8, top_p=0.95, n=3, seed=i)
        for i, n in enumerate(names)
    ]
    outs = llm.generate(prompts, params)
    return {(n, "greedy"): outs[i] for i, n in enumerate(names)} | {
        (n, "sampled"): outs[len(names) + i] for i, n in enumerate(names)
    }


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_outputs_validate(schema_outputs, name, mode):
    for c in schema_outputs[(name, mode)].outputs:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMAS[name])


def test_json_object(llm):
    """Greedy and sampled outputs close a JSON object. (The sampled ones get room: at temperature 0.7 this
    model may write a long string value first — 110 tokens for one of these seeds' draws.)"""
    params = [
        constrained(StructuredOutput(json_object=True), max_tokens=64),
        constrained(StructuredOutput(json_object=True), max_tokens=256, temperature=0.7, seed=3, n=2),
    ]
    p = chat(llm, "Describe a cat as a JSON object with a name and an age.")
    for out in llm.generate([p, p], params):
        for c in out.outputs:
            assert c.finish_reason == "stop" and isinstance(json.loads(c.text), dict)


def test_strict_refuses_what_llguidance_does_not_implement(llm):
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "no-such-format"}}}
    llm.engine.validate([1], constrained(StructuredOutput(json_schema=schema)))  # lenient: ignored
    with pytest.raises(BlazrError, match="no-such-format"):
        llm.engine.validate([1], constrained(StructuredOutput(json_schema=schema, strict=True)))


def test_objects_admit_no_unlisted_keys_unless_the_schema_says():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"x": {}}}, "b": {"type": "object"}},
        "allOf": [{"properties": {"c": {}}}],
        "$defs": {"d": {"properties": {"y": {}}, "additionalProperties": True}},
    }
    closed = narrow_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["b"]  # no properties: any object
    assert "additionalProperties" not in closed["allOf"][0]  # closing allOf members would reject the others'
    assert closed["$defs"]["d"]["additionalProperties"] is True
    assert "additionalProperties" not in schema  # a copy


def accepts(llm: LLM, spec: StructuredOutput, text: str) -> bool:
    """Whether the grammar of `spec` takes `text` (its ordinary tokens) whole."""
    m = llm.engine.grammars.matcher(spec, frozenset(llm.tokenizer.eos_token_ids))
    try:
        for t in llm.tokenizer.encode_ordinary(text):
            m.advance(t)
    except BlazrError:
        return False
    return m._inner.is_accepting()


def test_numbers_have_bounded_digits(llm):
    """A small model must not be able to write digits until max_tokens cuts its JSON (SmolLM2 did, writing
    a latitude): unbounded numbers get at most NUMBER_DECIMALS decimals and |x| < 10^15, unbounded integers
    ±(2^53 - 1); a schema's own bounds and multipleOf are kept."""
    free = StructuredOutput(json_schema={"type": "object", "properties": {"x": {"type": "number"}}})
    assert accepts(llm, free, '{"x": 16.7017}')
    assert accepts(llm, free, '{"x": -0.1234567891}')
    assert not accepts(llm, free, '{"x": -0.12345678912}')
    assert not accepts(llm, free, '{"x": 1000000000000000.5}')
    integer = StructuredOutput(json_schema={"type": "array", "items": {"type": "integer"}})
    assert accepts(llm, integer, "[9007199254740991, -9007199254740991]")
    assert not accepts(llm, integer, "[9007199254740992]")
    own = StructuredOutput(json_schema={"type": "number", "multipleOf": 0.5, "minimum": 0})
    assert accepts(llm, own, "999999999999999.5")
    assert not accepts(llm, own, "1000000000000000000.5")  # the other side's default bound
    assert not accepts(llm, own, "1.25") and not accepts(llm, own, "-0.5")
    count = StructuredOutput(json_schema={"type": "integer", "minimum": 0})  # pydantic's Field(ge=0)
    assert accepts(llm, count, "9007199254740991") and not accepts(llm, count, "9007199254740992")
    assert not accepts(llm, count, "-1")
    below = StructuredOutput(json_schema={"type": "integer", "exclusiveMaximum": 7})
    assert accepts(llm, below, "-9007199254740991") and not accepts(llm, below, "7")
    narrowed = narrow_schema({"type": ["number", "null"], "minimum": 0})
    assert narrowed == {"type": ["number", "null"], "minimum": 0, "maximum": 10**15, "multipleOf": 1e-10}
    safe = 2**53 - 1
    assert narrow_schema({"type": "integer"}) == {"type": "integer", "minimum": -safe, "maximum": safe}
    huge = {"type": "integer", "minimum": 10**20}  # past the default: the other side is left open
    assert narrow_schema(huge) == huge


def test_a_format_can_follow_a_reasoning_block(llm):
    """With ThinkFirst the text up to `</think>` is free, then the format holds: inside a block the prompt
    opened, or an optional block the output opens itself."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    opened = StructuredOutput(json_schema=schema, think=ThinkFirst(opened=True))
    optional = StructuredOutput(json_schema=schema, think=ThinkFirst(opened=False))
    thought = 'Let me see: {"a": "x"} is wrong.</think>\n\n{"a": 1}'
    assert accepts(llm, opened, thought)
    assert not accepts(llm, opened, '{"a": 1}')  # the block must be closed first
    assert not accepts(llm, opened, 'Hmm.</think>{"a": "x"}')
    assert accepts(llm, optional, "<think>" + thought)
    assert accepts(llm, optional, '{"a": 1}')
    assert not accepts(llm, optional, 'Let me see.</think>{"a": 1}')
    assert opened.key != optional.key != StructuredOutput(json_schema=schema).key
    regex = StructuredOutput(regex="[0-9]+", think=ThinkFirst("<r>", "</r>", opened=True))
    assert accepts(llm, regex, "why</r>42") and not accepts(llm, regex, "why</r>x")


KIND_CASES = [  # (spec fields, an answer it takes, one it refuses): one per kind, Lark in each form
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}, '{"a": 1}', '{"a": "x"}'),
    ({"json_object": True}, '{"b": [1]}', "[1]"),
    ({"regex": "[0-9]+"}, "42", "4x"),
    ({"choice": ["yes", "no"]}, "no", "maybe"),
    ({"grammar": 'start: "a" NUM\nNUM: /[0-9]+/'}, "a12", "b12"),
    ({"grammar": 'root ::= "(" [a-z]+ ")"'}, "(ab)", "(AB)"),  # GBNF: Lark with a %llguidance directive
    (  # a forced tool call's shape: framing text around an embedded schema
        {"grammar": 'start: "<tool_call>\\n" call "\\n</tool_call>"\n' + "call: " + lark_json(
            {"type": "object", "properties": {"name": {"const": "f"}}, "required": ["name"]})},
        '<tool_call>\n{"name": "f"}\n</tool_call>',
        '<tool_call>\n{"name": "g"}\n</tool_call>',
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    "fields,good,bad", KIND_CASES, ids=lambda c: next(iter(c)) if isinstance(c, dict) else ""
)
def test_every_kind_can_follow_a_reasoning_block(llm, fields, good, bad):
    """Each kind's grammar, whatever form llguidance gives it in (JSON for schemas and regexes, Lark text
    for choice / Lark / GBNF), is put behind the block; its own rule names (`start`) do not clash."""
    thought = "hmm { ( start: WS answer </think"  # text a grammar would refuse, a cut marker included
    for opened in (True, False):
        spec = StructuredOutput(**fields, think=ThinkFirst(opened=opened))
        block = ("" if opened else "<think>") + thought + ">\n\n"
        assert accepts(llm, spec, block + good), (fields, opened)
        assert not accepts(llm, spec, block + bad), (fields, opened)
        assert not accepts(llm, spec, block + good + "x"), (fields, opened)
        assert accepts(llm, spec, good) != opened  # an opened block must be closed first
        assert not accepts(llm, spec, "\n" + good)  # no block, no whitespace: the answer is the content


# ------------------------------------------------------------------------------ regex, choice, grammars


def test_regex_choice_and_grammars(llm):
    regex = r"[A-Z][a-z]{2,8} [0-9]{1,3}"
    choices = ["yes", "no", "it depends"]
    lark = 'start: expr\nexpr: NUM " " OP " " NUM\nOP: "+" | "-" | "*"\nNUM: /[1-9][0-9]{0,2}/'
    # at most 5 items: the list closes within 36 tokens whatever is sampled (unbounded, a sampled list ran
    # past max_tokens on an AVX2 host, whose logits round apart from AVX-512's)
    gbnf = 'root ::= "(" item ("," item){0,4} ")"\nitem ::= [a-z]{1,6}'
    cases = [
        (chat(llm, "Name a street and a number."), StructuredOutput(regex=regex), re.compile(regex)),
        (chat(llm, "Is the sky blue?"), StructuredOutput(choice=choices), None),
        (
            chat(llm, "Write a sum of two numbers."),
            StructuredOutput(grammar=lark),
            re.compile(r"[1-9][0-9]{0,2} [-+*] [1-9][0-9]{0,2}"),
        ),
        (
            chat(llm, "List some fruits in parentheses."),
            StructuredOutput(grammar=gbnf),
            re.compile(r"\([a-z]{1,6}(,[a-z]{1,6}){0,4}\)"),
        ),
    ]
    prompts = [p for p, _, _ in cases] * 2
    params = [constrained(s, max_tokens=40) for _, s, _ in cases] + [
        constrained(s, max_tokens=40, temperature=1.0, seed=5, n=3) for _, s, _ in cases
    ]
    outs = llm.generate(prompts, params)
    for out, (_, _, pattern) in zip(outs, cases * 2, strict=True):
        for c in out.outputs:
            assert c.finish_reason == "stop", c.text
            if pattern is None:
                assert c.text in choices
            else:
                assert pattern.fullmatch(c.text), c.text


def test_a_tool_call_grammar_embeds_a_json_schema(llm):
    """`lark_json` composes a schema into a Lark grammar (what tool_choice "required" needs): the call is
    wrapped in its markers and its arguments validate."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "properties": {"city": NAME}, "required": ["city"]},
        },
        "required": ["name", "arguments"],
    }
    lark = 'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: ' + lark_json(schema)
    p = chat(llm, "What is the weather in Paris?")
    c = llm.generate([p], constrained(StructuredOutput(grammar=lark), max_tokens=60))[0].outputs[0]
    match = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", c.text, re.DOTALL)
    assert match and c.finish_reason == "stop", c.text
    jsonschema.validate(json.loads(match.group(1)), schema)


def test_free_rows_beside_constrained_rows_get_their_tokens_alone(llm):
    """Greedy free requests in a batch with constrained ones: token for token what each gives alone."""
    free = [chat(llm, "Tell me about the moon."), chat(llm, "What is 2 + 2?")]
    free_params = SamplingParams(max_tokens=24, temperature=0.0)
    alone = [llm.generate([p], free_params)[0].outputs[0].token_ids for p in free]
    prompts = [free[0], schema_prompt(llm, "person"), free[1], chat(llm, "Pick one.")]
    params = [
        free_params,
        constrained(StructuredOutput(json_schema=SCHEMAS["person"])),
        free_params,
        constrained(StructuredOutput(choice=["a", "b"])),
    ]
    mixed = llm.generate(prompts, params)
    assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == alone
    jsonschema.validate(json.loads(mixed[1].outputs[0].text), SCHEMAS["person"])
    assert mixed[3].outputs[0].text in ("a", "b")


def test_preempted_constrained_sequences_continue_where_they_were(llm):
    """Four constrained requests in 10 blocks of 16 tokens: some are preempted and recomputed; the matcher
    follows the output tokens (never recomputed), so the outputs equal a roomy engine's and validate."""
    cfg = EngineConfig(max_num_seqs=4, max_model_len=256, num_kv_blocks=10, enable_prefix_caching=False)
    tight = LLM(cpu=True, engine_config=cfg)
    names = ["person", "nested objects", "array of objects", "number bounds"]
    prompts = [chat(llm, f"Describe one {n} as JSON.") for n in ("person", "user", "order", "day")]
    params = [constrained(StructuredOutput(json_schema=SCHEMAS[n])) for n in names]
    before = tight.engine.scheduler.num_preemptions
    got = tight.generate(prompts, params)
    assert tight.engine.scheduler.num_preemptions > before
    want = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    for out, n in zip(got, names, strict=True):
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMAS[n])


def test_end_tokens(llm):
    """The grammar's end is the sequence's end: with ignore_eos it still stops there; min_tokens keeps the end
    out while the grammar can go on; custom stop_token_ids end it."""
    p = chat(llm, "Give me a number.")
    digits = StructuredOutput(regex="[0-9]{1,12}")
    out = llm.generate(
        [p] * 3,
        [
            constrained(StructuredOutput(choice=["one", "two"]), ignore_eos=True),
            constrained(digits, min_tokens=6),
            constrained(digits, stop_token_ids=[0], ignore_eos=True),
        ],
    )
    assert out[0].outputs[0].text in ("one", "two") and out[0].outputs[0].finish_reason == "stop"
    assert len(out[1].outputs[0].token_ids) >= 6 and out[1].outputs[0].finish_reason == "stop"
    assert out[2].outputs[0].token_ids[-1] == 0 and re.fullmatch("[0-9]{1,12}", out[2].outputs[0].text)


# -------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (dict(json_schema={"type": "object", "properties": {"a": {"type": "foo"}}}), "json_schema: .*foo"),
        (dict(json_schema="{not json"), "json_schema: not valid JSON"),
        (dict(regex="a(b"), "regex: .*unclosed group"),
        (dict(grammar="start: nothing_defined"), "grammar: .*nothing_defined"),
        (dict(grammar="root ::= ("), "grammar"),
        (dict(choice=[]), "choice must be a non-empty list"),
        (dict(regex="a", choice=["a"]), "exactly one of"),
        (dict(), "exactly one of"),
    ],
)
def test_bad_specs_are_one_line_errors(llm, spec, message):
    with pytest.raises(BlazrError, match=message) as e:
        llm.engine.validate([1], SamplingParams(structured=StructuredOutput(**spec)))
    assert "\n" not in str(e.value)


def test_bad_spec_through_generate(llm):
    with pytest.raises(BlazrError, match="regex"):
        llm.generate([[1, 2]], SamplingParams(structured=StructuredOutput(regex="(")))


# ----------------------------------------------------------------------------------------- bitmasks


def test_bitmask_fast_path_equals_reference():
    g = torch.Generator().manual_seed(0)
    V = 1000
    logits = torch.randn(5, V, generator=g)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, words(V)), generator=g, dtype=torch.int32)
    rows = [0, 2, 3]
    fast = logits.clone()
    apply_token_bitmask(fast, bitmask, rows)
    ref = logits.clone()
    masked = ref[rows]
    apply_token_bitmask_reference(masked, bitmask)
    ref[rows] = masked
    assert torch.equal(fast, ref)
    assert torch.equal(fast[[1, 4]], logits[[1, 4]])  # free rows untouched
    every_row, every_ref = logits[:3].clone(), logits[:3].clone()
    apply_token_bitmask(every_row, bitmask, [0, 1, 2])
    apply_token_bitmask_reference(every_ref, bitmask)
    assert torch.equal(every_row, every_ref)
    wide = logits.double()  # not the float32 CPU fast path: the one a GPU takes (gather, mask, scatter)
    apply_token_bitmask(wide, bitmask, rows)
    assert torch.equal(wide.float(), ref)
