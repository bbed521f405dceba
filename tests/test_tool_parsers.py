"""Tool-call parsers (server/tool_parsers.py): every format fed whole, in every split into two pieces and
character by character reassembles to the same hand-written content and calls; content streams before a
call, the name comes whole in the call's first delta and the arguments stream as the model wrote them;
unexpected shapes are re-serialized, malformed calls are content; and each parser's grammar, compiled by
llguidance on a tiny byte-level tokenizer, accepts calls that parse back into the same calls and refuses
wrong ones."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from blazr.engine.grammar import GrammarCompiler, StructuredOutput, words
from blazr.errors import BlazrError
from blazr.server.tool_call_text import ToolCallDelta
from blazr.server.tool_parsers import (
    TOOL_PARSERS,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    ParsedDelta,
    ToolParser,
    detect_tool_parser,
    merge_deltas,
    parse_tool_calls,
)

# the parsers of call formats (harmony parses the whole output, channels too: test_harmony.py)
CALL_PARSERS = [n for n, p in TOOL_PARSERS.items() if not p.splits_channels]


def splits(text: str) -> list[list[str]]:
    """The whole text, every split into two pieces, and one character at a time."""
    return [[text], *([text[:i], text[i:]] for i in range(1, len(text))), list(text)]


def run(name: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]], int]:
    parser = TOOL_PARSERS[name]()
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    content, calls = merge_deltas(deltas)
    return content, [(c.name, c.arguments) for c in calls], parser.num_calls


W = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2], "q": "a \\"}\\" b"}}'
W_ARGS = '{"city": "Paris", "days": [1, 2], "q": "a \\"}\\" b"}'
T = '{"name": "get_time", "arguments": {"tz": "CET"}}'

# (parser, output, content, calls): what every way of feeding the output must give
CASES = [
    ("hermes", "Hello <b>world</b>, 1 < 2 <tool", "Hello <b>world</b>, 1 < 2 <tool", []),
    (
        "hermes",
        f"Let me check.\n\n<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>\nDone.",
        "Let me check.\n\nDone.",
        [("get_weather", W_ARGS), ("get_time", '{"tz": "CET"}')],
    ),
    (  # no </tool_call> at the end; markers and braces inside a string are text
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"a": "x</tool_call>}<tool_call>"}}',
        "",
        [("f", '{"a": "x</tool_call>}<tool_call>"}')],
    ),
    (  # unexpected shapes: parsed whole, re-serialized
        "hermes",
        '<tool_call>{"arguments": {"b":1,"c":"é"}, "name": "g"}</tool_call><tool_call>\n'
        '{"name": "h", "parameters": {"x":[]}}\n</tool_call>'
        '<tool_call>{"name": "i", "arguments": "{\\"y\\":2}"}</tool_call>'
        '<tool_call>{"type": "function", "function": {"name": "j", "arguments": {}}}</tool_call>',
        "",
        [("g", '{"b": 1, "c": "é"}'), ("h", '{"x": []}'), ("i", '{"y": 2}'), ("j", "{}")],
    ),
    (  # a missing outer brace is forgiven once the name is out; text after the calls is content
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>\n\nThat is all.',
        "That is all.",
        [("f", '{"a": 1}')],
    ),
    (  # malformed calls are content, markers included
        "hermes",
        '<tool_call>\nget_weather(city="Paris")\n</tool_call> '
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call> '
        '<tool_call>{"name": 1, "arguments": {}}</tool_call> <tool_call>{bad}</tool_call> '
        '<tool_call>{"name": "f"} x</tool_call> <tool_call>{"name": "f", "argu',
        '<tool_call>\nget_weather(city="Paris")\n</tool_call> '
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call> '
        '<tool_call>{"name": 1, "arguments": {}}</tool_call> <tool_call>{bad}</tool_call> '
        '<tool_call>{"name": "f"} x</tool_call> <tool_call>{"name": "f", "argu',
        [],
    ),
    (  # a good call, then a bad one: the bad one is content
        "hermes",
        f"<tool_call>\n{T}\n</tool_call>\n<tool_call>\n<oops>\n</tool_call>",
        "<tool_call>\n<oops>\n</tool_call>",
        [("get_time", '{"tz": "CET"}')],
    ),
    (  # the output ends inside the arguments after the name went out: the call stands, cut
        "hermes",
        'On it. <tool_call>\n{"name": "f", "arguments": {"a": "hel',
        "On it. ",
        [("f", '{"a": "hel')],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; '
        '{"name": "g", "arguments": {"b": [true, null]}}',
        "",
        [("f", '{"a": 1}'), ("g", '{"b": [true, null]}')],
    ),
    (
        "llama3_json",
        '\n{"name": "f", "parameters": {}};\n{"type": "function", "name": "g", "parameters": {"x":"y"}};',
        "",
        [("f", "{}"), ("g", '{"x": "y"}')],
    ),
    ("llama3_json", "  The answer is {42}.", "  The answer is {42}.", []),
    ("llama3_json", '{"foo": 1, "bar": [2]}', '{"foo": 1, "bar": [2]}', []),
    ("llama3_json", "<|python_tag|>search(q)", "<|python_tag|>search(q)", []),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": 1}} and then some text',
        "and then some text",
        [("f", '{"a": 1}')],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
        "Sure.",
        [("f", '{"a": 1}'), ("g", "{}")],
    ),
    (
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"a": "[TOOL_CALLS]"}[TOOL_CALLS]g_2[CALL_ID]a1B2c3D4e[ARGS] {"b": [2]}',
        "",
        [("f", '{"a": "[TOOL_CALLS]"}'), ("g_2", '{"b": [2]}')],
    ),
    ("mistral", "[TOOL_CALLS]not a call [TOOL_", "[TOOL_CALLS]not a call [TOOL_", []),
    ("mistral", '[TOOL_CALLS][{"name": "f"}]', '[TOOL_CALLS][{"name": "f"}]', []),
    ("mistral", "[TOOL_CALLS]f[ARGS]oops", "[TOOL_CALLS]f[ARGS]oops", []),
]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES)
def test_every_way_of_feeding_gives_the_same_answer(parser, text, content, calls):
    for pieces in splits(text):
        assert run(parser, pieces) == (content, calls, len(calls)), pieces
    for _, args in calls:
        if args.endswith("}"):
            assert isinstance(json.loads(args), dict)


FRAGMENTS = [
    *("<tool_call>", "</tool_call>", "<tool_", "[TOOL_CALLS]", "[ARGS]", "[TOOL_", "<|python_tag|>", "; "),
    *('{"name": "f", "arguments": ', '{"name": "g", "parameters": ', "f[ARGS]", '"x\\"y"', "{", "}", "["),
    *("]", '"', "\\", ":", ",", " ", "\n", "é", "text", "1", "true", "<", "/"),
]
ARGS = ['{"a": 1}', "{}", '{"b": [1, {"c": "}]"}], "d": "x\\"</tool_call>"}', '{ "e" : null }']


def random_output(rng: random.Random, parser: str) -> str:
    """Text, calls in the parser's format (several shapes) and stray fragments; then maybe cut or spliced."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        args = rng.choice(ARGS)
        key = rng.choice(["arguments", "parameters"])
        obj = rng.choice(
            [f'{{"name": "f", "{key}": {args}}}', f'{{"{key}": {args}, "name": "g"}}', '{"name": "h"}']
        )
        kind = rng.random()
        if kind < 0.3:
            parts.append(rng.choice(["Sure. ", "1 < 2 ", "\n", "[x] ", " {y} "]))
        elif kind < 0.45:
            parts.append(rng.choice(FRAGMENTS))
        elif parser == "hermes":
            parts.append(f"<tool_call>\n{obj}\n</tool_call>\n")
        elif parser == "llama3_json":
            parts.append(obj + rng.choice(["; ", ";", "\n", ""]))
        elif rng.random() < 0.5:
            parts.append(f"[TOOL_CALLS][{obj}, {obj}]")
        else:
            parts.append(f"[TOOL_CALLS]f{rng.choice(['', '[CALL_ID]a1'])}[ARGS]{args}")
    text = "".join(parts)
    if rng.random() < 0.3:
        i = rng.randrange(len(text) + 1)
        text = text[:i] + rng.choice(FRAGMENTS) + text[i:]
    if rng.random() < 0.3:
        text = text[: rng.randrange(1, len(text) + 1)]
    return text


@pytest.mark.parametrize("parser", CALL_PARSERS)
def test_random_outputs_never_depend_on_how_they_are_cut(parser):
    """Seeded random outputs made of markers, call heads and JSON pieces: fed whole, character by character
    or in random pieces, the same content and calls; no call means the content is the output, unchanged;
    each call's id and name come in its first delta only."""
    rng = random.Random(parser)
    with_calls = 0
    for _ in range(300):
        text = random_output(rng, parser)
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
        random_pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        want = run(parser, [text])
        for pieces in (list(text), random_pieces):
            p = TOOL_PARSERS[parser]()
            deltas = [p.feed(x) for x in pieces] + [p.finish()]
            content, calls = merge_deltas(deltas)
            assert (content, [(c.name, c.arguments) for c in calls], p.num_calls) == want, pieces
            seen: set[int] = set()
            for t in (t for d in deltas for t in d.tool_calls):
                assert (t.index not in seen) == (t.id is not None) == (t.name is not None), pieces
                seen.add(t.index)
        if want[2] == 0:
            assert want[0] == text
        with_calls += want[2] > 0
    assert 60 < with_calls < 270  # both kinds, many of each


def test_content_streams_until_it_may_be_a_marker():
    p = HermesToolParser()
    assert p.feed("Hello <") == ParsedDelta("Hello ")
    assert p.feed("b> x <tool_c") == ParsedDelta("<b> x ")
    assert p.feed("all>\n") == ParsedDelta()
    assert p.num_calls == 0
    m = MistralToolParser()
    assert m.feed("a [TOOL") == ParsedDelta("a ")
    assert m.feed("S]") == ParsedDelta("[TOOLS]")


def test_the_name_comes_whole_then_the_arguments_stream():
    p = HermesToolParser()
    steps = [
        ('<tool_call>\n{"name": "get_', None, ""),
        ('weather", "arguments": ', None, ""),
        ('{"city": "Pa', "get_weather", '{"city": "Pa'),
        ('ris", "n": [1', None, 'ris", "n": [1'),
        ("]}", None, "]}"),
        ("}\n</tool", None, ""),
        ("_call>", None, ""),
    ]
    first_id = None
    for piece, name, args in steps:
        d = p.feed(piece)
        assert d.content == ""
        if name is None and not args:
            assert d.tool_calls == ()
            continue
        (call,) = d.tool_calls
        assert (call.index, call.name, call.arguments) == (0, name, args)
        if name is not None:
            first_id = call.id
        else:
            assert call.id is None
    assert first_id and p.num_calls == 1
    assert p.finish() == ParsedDelta()


def test_an_unexpected_shape_is_held_until_its_end():
    p = HermesToolParser()
    assert p.feed('<tool_call>{"parameters": {"a": ') == ParsedDelta()
    assert p.feed("1}, ") == ParsedDelta()
    d = p.feed('"name": "f"}')
    (call,) = d.tool_calls
    assert (call.name, call.arguments) == ("f", '{"a": 1}') and call.id and p.num_calls == 1


def test_one_delta_per_call_per_piece_and_unique_ids():
    text = "".join(f'<tool_call>{{"name": "f{i}", "arguments": {{"i": {i}}}}}</tool_call>' for i in range(5))
    p = HermesToolParser()
    d = p.feed(text)
    assert [(c.index, c.name, c.arguments) for c in d.tool_calls] == [
        (i, f"f{i}", f'{{"i": {i}}}') for i in range(5)
    ]
    ids = [c.id for c in d.tool_calls]
    ids += [
        c.id for _, calls in (parse_tool_calls(HermesToolParser(), text) for _ in range(3)) for c in calls
    ]
    assert len(set(ids)) == len(ids) == 20
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)
    assert p.num_calls == 5


def test_ids_in_the_stream_match_the_merged_calls():
    p = Llama3JsonToolParser()
    deltas = [p.feed(c) for c in '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {}}']
    deltas.append(p.finish())
    firsts = [t for d in deltas for t in d.tool_calls if t.id]
    _, calls = merge_deltas(deltas)
    assert [(t.index, t.id, t.name) for t in firsts] == [(i, c.id, c.name) for i, c in enumerate(calls)]
    assert all(t.name is None for d in deltas for t in d.tool_calls if t.id is None)


def test_parse_tool_calls_content():
    h = HermesToolParser
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert parse_tool_calls(h(), f"  \n{call}")[0] is None  # whitespace beside calls
    assert parse_tool_calls(h(), f"Sure: {call}")[0] == "Sure: "
    assert parse_tool_calls(h(), "") == (None, [])
    assert parse_tool_calls(h(), "  ") == ("  ", [])
    assert parse_tool_calls(h(), "Hi") == ("Hi", [])


def test_merge_deltas():
    deltas = [
        ParsedDelta("a"),
        ParsedDelta("b", (ToolCallDelta(0, "call_x", "f", '{"a'),)),
        ParsedDelta("", (ToolCallDelta(0, arguments='": 1}'), ToolCallDelta(1, "call_y", "g", "{}"))),
    ]
    content, calls = merge_deltas(deltas)
    assert content == "ab"
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_x", "f", '{"a": 1}'),
        ("call_y", "g", "{}"),
    ]


def test_registry_and_detection():
    assert {n: p.needs_special_tokens for n, p in TOOL_PARSERS.items()} == {
        "hermes": False,
        "llama3_json": False,
        "mistral": True,
        "harmony": True,
    }
    assert [n for n, p in TOOL_PARSERS.items() if p.splits_channels] == ["harmony"]
    assert all(p.name == n for n, p in TOOL_PARSERS.items())
    qwen = (
        "{%- if tools %}<tools>{{ tool | tojson }}</tools> ... <tool_call>\\n{{ tc | tojson }}\\n</tool_call>"
    )
    assert detect_tool_parser(qwen) == "hermes"
    assert detect_tool_parser("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' + calls }}") == "mistral"
    assert detect_tool_parser("{{- '<|python_tag|>' + tool_call.name }}") == "llama3_json"
    llama = "<|start_header_id|>{{ role }}<|end_header_id|>{% if tools is not none %}{{ tools }}{% endif %}"
    assert detect_tool_parser(llama) == "llama3_json"
    assert detect_tool_parser("<|start_header_id|>{{ role }}<|end_header_id|>{{ content }}") is None
    assert detect_tool_parser("<|im_start|>{{ role }}\n{{ content }}<|im_end|>") is None
    gpt_oss = (
        "{{- '<|start|>assistant to=' + 'functions.' + name + '<|channel|>commentary json<|message|>' }}"
    )
    assert detect_tool_parser(gpt_oss) == "harmony"


# ------------------------------------------------------------------------------------------- grammars

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"$ref": "#/$defs/unit"},
                    "days": {"type": "integer"},
                    "more_days": {"$ref": "#/properties/days"},  # rebased under "arguments"
                },
                "required": ["city"],
                "$defs": {"unit": {"enum": ["c", "f"]}},
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},  # no parameters: {}
]


@pytest.fixture(scope="module")
def compiler(tmp_path_factory) -> GrammarCompiler:
    """A byte-level BPE tokenizer with no merges (one token per byte) and the markers as added tokens:
    `[TOOL_CALLS]` a control token (as Mistral's), `<tool_call>` a text one (as Qwen's)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from blazr.tokenizer import TokenizerSource, load_tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("</s>", special=True), AddedToken("[TOOL_CALLS]", special=True)])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    path = tmp_path_factory.mktemp("bytes_tokenizer")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    t = load_tokenizer(TokenizerSource(tokenizer_dir=Path(path)))
    return GrammarCompiler(t, t.vocab_size)


def walk(compiler: GrammarCompiler, grammar: str, text: str, first: list[int] | None = None) -> bool:
    """Does the grammar take `text` (as byte tokens, after the ids `first`) and then end there?"""
    m = compiler.matcher(StructuredOutput(grammar=grammar), frozenset())
    try:
        for t in [*(first or []), *compiler.tokenizer.encode_ordinary(text)]:
            m.advance(t)
        m.advance(next(iter(compiler.eos_ids)))
    except BlazrError:
        return False
    return True


def allowed_first(compiler: GrammarCompiler, grammar: str, token: int) -> bool:
    m = compiler.matcher(StructuredOutput(grammar=grammar), frozenset())
    row = np.zeros(words(compiler.vocab_size), dtype=np.uint32)
    m.fill(row)
    return bool(row[token >> 5] >> np.uint32(token & 31) & np.uint32(1))


def frame(parser: str, calls: list[str]) -> str:
    """Calls written in a parser's format, as its grammar writes them."""
    if parser == "hermes":
        return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)
    if parser == "llama3_json":
        return "; ".join(calls)
    return "[TOOL_CALLS][" + ", ".join(calls) + "]"


def call(parser: str, name: str, args: dict) -> str:
    return json.dumps({"name": name, TOOL_PARSERS[parser].grammar_key: args})


WEATHER = {"city": "Paris", "unit": "c", "days": 3, "more_days": 4}


@pytest.mark.parametrize("parser", CALL_PARSERS)
def test_grammar_round_trip(compiler, parser):
    cls: type[ToolParser] = TOOL_PARSERS[parser]
    g = cls.grammar(TOOLS, None, True)
    one = frame(parser, [call(parser, "get_weather", WEATHER)])
    two = frame(parser, [call(parser, "get_weather", {"city": "Oslo"}), call(parser, "now", {})])
    for text, want in [
        (one, [("get_weather", json.dumps(WEATHER))]),
        (two, [("get_weather", '{"city": "Oslo"}'), ("now", "{}")]),
    ]:
        assert walk(compiler, g, text), text
        content, calls = parse_tool_calls(cls(), text)
        assert content is None and [(c.name, c.arguments) for c in calls] == want
    bad = [
        call(parser, "get_weather", {**WEATHER, "unit": "k"}),  # not in the $defs enum
        call(parser, "get_weather", {**WEATHER, "more_days": "4"}),  # the rebased $ref: an integer
        call(parser, "get_weather", {"unit": "c"}),  # city is required
        call(parser, "get_weather", {"city": "Paris", "wind": 1}),  # no other keys
        call(parser, "now", {"x": 1}),
        call(parser, "get_time", {}),  # no such tool
    ]
    for c in bad:
        assert not walk(compiler, g, frame(parser, [c])), c
    assert not walk(compiler, g, "")  # at least one call
    assert not walk(compiler, g, "Sure. " + one)  # calls only
    wrong_key = "parameters" if cls.grammar_key == "arguments" else "arguments"
    assert not walk(compiler, g, frame(parser, [json.dumps({"name": "now", wrong_key: {}})]))


@pytest.mark.parametrize("parser", CALL_PARSERS)
def test_grammar_single_and_named(compiler, parser):
    cls = TOOL_PARSERS[parser]
    weather, now = call(parser, "get_weather", {"city": "Rome"}), call(parser, "now", {})
    single = cls.grammar(TOOLS, None, False)
    assert walk(compiler, single, frame(parser, [weather]))
    assert not walk(compiler, single, frame(parser, [weather, now]))
    named = cls.grammar(TOOLS, "now", True)
    assert walk(compiler, named, frame(parser, [now, now]))
    assert not walk(compiler, named, frame(parser, [weather]))
    assert not walk(compiler, named, frame(parser, [now, weather]))
    with pytest.raises(BlazrError, match="'nope' is not in tools"):
        cls.grammar(TOOLS, "nope", True)
    with pytest.raises(BlazrError, match="tools is empty"):
        cls.grammar([], None, True)
    with pytest.raises(BlazrError, match="needs a function with a name"):
        cls.grammar([{"type": "function"}], None, True)


def test_grammar_takes_a_text_marker_token(compiler):
    """Qwen's `<tool_call>` is an added text token: a call that starts with it fits the hermes grammar."""
    special = compiler.tokenizer.special_tokens
    hermes = HermesToolParser.grammar(TOOLS, None, True)
    text = frame("hermes", [call("hermes", "now", {})])
    assert walk(compiler, hermes, text.removeprefix("<tool_call>"), first=[special["<tool_call>"]])
    assert not walk(compiler, hermes, text.removeprefix("<tool_call>"), first=[special["[TOOL_CALLS]"]])


def test_grammar_mask_offers_a_text_marker_token(compiler):
    """A forced `<tool_call>` is offered as the model's own added token (llguidance masks forced text to
    its canonical tokens, from the tokenize callback of engine/grammar.py's build_ll_tokenizer)."""
    hermes = HermesToolParser.grammar(TOOLS, None, True)
    assert allowed_first(compiler, hermes, compiler.tokenizer.special_tokens["<tool_call>"])


def test_mistral_grammar_writes_its_marker_as_the_control_token(compiler):
    """Given the control token's id (the server gives it), the grammar writes `[TOOL_CALLS]` as that token,
    the way the model learned it, and refuses the text spelling."""
    ids = {"[TOOL_CALLS]": compiler.tokenizer.special_tokens["[TOOL_CALLS]"]}
    mistral = MistralToolParser.grammar(TOOLS, None, True, ids)
    text = frame("mistral", [call("mistral", "now", {})])
    assert walk(compiler, mistral, text.removeprefix("[TOOL_CALLS]"), first=[ids["[TOOL_CALLS]"]])
    assert allowed_first(compiler, mistral, ids["[TOOL_CALLS]"])
    assert not allowed_first(compiler, mistral, compiler.tokenizer.encode_ordinary("[")[0])
    assert not walk(compiler, mistral, text)
    # Hermes has no control-token markers here: the ids of others change nothing
    assert HermesToolParser.grammar(TOOLS, None, True, ids) == HermesToolParser.grammar(TOOLS, None, True)


def test_mistral_grammar_without_ids_writes_its_marker_as_text(compiler):
    """Without the ids (a caller that has no tokenizer) the marker is text, which detokenizes the same;
    the control token is refused."""
    mistral = MistralToolParser.grammar(TOOLS, None, True)
    text = frame("mistral", [call("mistral", "now", {})])
    assert walk(compiler, mistral, text)
    assert not allowed_first(compiler, mistral, compiler.tokenizer.special_tokens["[TOOL_CALLS]"])
    assert allowed_first(compiler, mistral, compiler.tokenizer.encode_ordinary("[")[0])
    assert not walk(compiler, mistral, text.removeprefix("[TOOL_CALLS]"))
