"""GPT-OSS's harmony format (server/harmony.py): the output parser on hand-written harmony text — analysis
and final channels, calls in both header forms, several calls, content without channels, a prefill —
fed whole, in every split into two pieces and character by character, with no marker ever leaking into
content or reasoning; seeded random outputs that never depend on how they are cut; the forced-call and
final-channel grammars compiled by llguidance on a byte-level tokenizer whose harmony markers are control
tokens; the conversation as GPT-OSS's own chat template (tests/gpt_oss_chat_template.jinja, from
openai/gpt-oss-120b via llama.cpp) renders it; and the tokenizer's stop tokens for that template."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from blazr.chat_template import ChatTemplate
from blazr.engine.grammar import GrammarCompiler, StructuredOutput, ThinkFirst, words
from blazr.errors import BlazrError
from blazr.server import harmony
from blazr.server.harmony import HarmonyParser, template_effort, template_messages, template_tools
from blazr.server.tool_parsers import ParsedDelta, merge_deltas

TEMPLATE = Path(__file__).with_name("gpt_oss_chat_template.jinja")
A, F = "<|channel|>analysis<|message|>", "<|start|>assistant<|channel|>final<|message|>"
E, S = "<|end|>", "<|start|>assistant"
CALL_IN_CHANNEL = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
CALL_IN_ROLE = " to=functions.get_time<|channel|>commentary json<|message|>"
W_ARGS = '{"city":"Paris","q":"a <b> \\"}\\""}'


def splits(text: str) -> list[list[str]]:
    return [[text], *([text[:i], text[i:]] for i in range(1, len(text))), list(text)]


def run(pieces: list[str], calls: bool = True, tail: str = "") -> tuple[str, str, list[tuple[str, str]], int]:
    p = HarmonyParser(calls, tail)
    deltas = [p.feed(x) for x in pieces] + [p.finish()]
    content, merged = merge_deltas(deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    seen: set[int] = set()
    for t in (t for d in deltas for t in d.tool_calls):  # id and name in each call's first delta only
        assert (t.index not in seen) == (t.id is not None) == (t.name is not None)
        seen.add(t.index)
    return content, reasoning, [(c.name, c.arguments) for c in merged], p.num_calls


# (output, content, reasoning, calls)
CASES = [
    (f"{A}The user greets.{E}{F}Hello <b>there</b>!", "Hello <b>there</b>!", "The user greets.", []),
    (f"{A}Need weather.{E}{S}{CALL_IN_CHANNEL}{W_ARGS}", "", "Need weather.", [("get_weather", W_ARGS)]),
    (CALL_IN_ROLE.lstrip() + '{"tz":"CET"}', "", "", [("get_time", '{"tz":"CET"}')]),
    (  # several calls, a preamble (commentary without a recipient: content) and two analysis messages
        f"{A}One.{E}{S}<|channel|>commentary<|message|>Checking.{E}{S}{CALL_IN_CHANNEL}{{}}{E}"
        f"{S}{A}Two.{E}{S}{CALL_IN_ROLE}{{}}",
        "Checking.",
        "One.\n\nTwo.",
        [("get_weather", "{}"), ("get_time", "{}")],
    ),
    ("Just text, 1 < 2 <| not a marker", "Just text, 1 < 2 <| not a marker", "", []),  # no channels
    (f"{A}Only thinking, cut off", "", "Only thinking, cut off", []),
    (f"{A}x{E}{S}<|channel|>fin", "", "x", []),  # a header the output ends inside: dropped
    (f"{A}x{E}\n{S}<|channel|>analysis to=python code<|message|>print(1){E}{F}2", "2", "x\n\nprint(1)", []),
]


@pytest.mark.parametrize(("text", "content", "reasoning", "calls"), CASES)
def test_every_cut_gives_the_same_split(text, content, reasoning, calls):
    for pieces in splits(text):
        assert run(pieces) == (content, reasoning, calls, len(calls)), pieces


def test_markers_cut_across_pieces_never_leak():
    p = HarmonyParser()
    assert p.feed("<|chan") == ParsedDelta()
    assert p.feed("nel|>final<|mess") == ParsedDelta()
    assert p.feed("age|>Hi <") == ParsedDelta("Hi ")
    assert p.feed("|en") == ParsedDelta()
    assert p.feed("d|><|start|>assistant<|channel|>analysis<|message|>hm") == ParsedDelta(reasoning="hm")
    assert p.feed("<|e") == ParsedDelta()
    assert p.finish() == ParsedDelta(reasoning="<|e")  # at the end a cut marker is text


def test_a_call_is_announced_with_its_header_then_its_arguments_stream():
    p = HarmonyParser()
    first = p.feed(f"{A}x{E}{S}<|channel|>commentary to=functions.get_weather <|constrain|>json")
    assert first.reasoning == "x" and first.tool_calls == () and p.num_calls == 0
    d = p.feed('<|message|>{"city":"Pa')
    (t,) = d.tool_calls
    assert (t.index, t.name, t.arguments) == (0, "get_weather", '{"city":"Pa')
    assert t.id is not None and t.id.startswith("call_")
    (t,) = p.feed('ris"}').tool_calls
    assert (t.id, t.name, t.arguments) == (None, None, 'ris"}')
    assert p.finish() == ParsedDelta() and p.num_calls == 1


def test_with_calls_off_a_call_is_content():
    assert run([f"{A}x{E}{S}{CALL_IN_CHANNEL}{{}}"], calls=False) == ("{}", "x", [], 0)


def test_a_prompt_ending_inside_a_message_starts_the_output_in_its_body():
    tail = "<|end|><|start|>assistant<|channel|>final<|message|>Sure,"
    assert run([" it is 4."], tail=tail) == (" it is 4.", "", [], 0)
    assert run(["so 4.<|end|>"], tail="<|start|>assistant<|channel|>analysis<|message|>x") == (
        "",
        "so 4.",
        [],
        0,
    )
    assert run([f"{A}x{E}"], tail="<|start|>user<|message|>hi<|end|><|start|>assistant") == ("", "x", [], 0)


FRAGMENTS = [
    *(
        A,
        E,
        S,
        F,
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|constrain|>",
        "<|",
        "<|chan",
        "final",
        "json",
    ),
    *(CALL_IN_CHANNEL, CALL_IN_ROLE, " to=", "to=functions.", "analysis", "commentary", '{"a": 1}'),
    *("text", " ", "\n", "é", "<", "|>", "1 < 2"),
]


def test_random_outputs_never_depend_on_how_they_are_cut():
    """Seeded random outputs of markers, headers and text: fed whole, character by character or in random
    pieces, the same split; nothing of a marker in content or reasoning unless the output had that text
    outside any marker."""
    rng = random.Random(43)
    with_calls = with_reasoning = 0
    for _ in range(400):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 8)))
        cuts = (
            sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
            if len(text) > 1
            else []
        )
        random_pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        want = run([text])
        for pieces in (list(text), random_pieces):
            assert run(pieces) == want, pieces
        for marker in harmony.MARKERS:
            assert marker not in want[0] and marker not in want[1], text
        with_calls += want[3] > 0
        with_reasoning += bool(want[1])
    assert 40 < with_calls < 360 and 20 < with_reasoning < 360  # each kind, many times


# ------------------------------------------------------------------------------------------- grammars

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
                "required": ["city"],
                "$defs": {"unit": {"enum": ["c", "f"]}},
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]


@pytest.fixture(scope="module")
def compiler(tmp_path_factory) -> GrammarCompiler:
    """A byte-level tokenizer (one token per byte) whose harmony markers are control tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from blazr.tokenizer import TokenizerSource, load_tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(m, special=True) for m in ("</s>", *harmony.MARKERS)])
    path = tmp_path_factory.mktemp("harmony_tokenizer")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (path / "chat_template.jinja").write_text(TEMPLATE.read_text())
    t = load_tokenizer(TokenizerSource(tokenizer_dir=Path(path)))
    return GrammarCompiler(t, t.vocab_size)


def ids_of(compiler: GrammarCompiler, text: str) -> list[int]:
    """Harmony text as the model writes it: markers as their control tokens, the rest byte by byte."""
    from blazr.engine.thinking import marker_ids

    return list(marker_ids(compiler.tokenizer, text))


def control(compiler: GrammarCompiler) -> dict[str, int]:
    return {m: compiler.tokenizer.special_tokens[m] for m in harmony.MARKERS}


def walk(compiler: GrammarCompiler, spec: StructuredOutput, text: str) -> bool:
    """Does the grammar take `text` (markers as control tokens) and then end there (on `<|call|>` or an
    end token)?"""
    ends = frozenset({control(compiler)["<|call|>"], control(compiler)["<|return|>"]})
    m = compiler.matcher(spec, ends)
    try:
        for t in ids_of(compiler, text):
            m.advance(t)
        if not m.is_done:
            m.advance(control(compiler)["<|return|>"])
    except BlazrError:
        return False
    return True


def allowed(row: np.ndarray, vocab_size: int) -> set[int]:
    return {t for t in range(vocab_size) if row[t >> 5] >> np.uint32(t & 31) & np.uint32(1)}


def test_the_forced_call_grammar(compiler):
    ids = control(compiler)
    spec = StructuredOutput(grammar=HarmonyParser.grammar(TOOLS, None, True, ids))
    call = (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
    )
    assert walk(compiler, spec, call)
    assert walk(compiler, spec, f"{A}I need the weather <|> tool.{E}{S}{call}")  # reasoning first
    assert walk(
        compiler, spec, "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>"
    )
    for bad in (
        call.replace('"Oslo"', "1"),  # not the schema
        call.replace('{"city": "Oslo"}', '{"city": "Oslo", "unit": "k"}'),  # not in the $defs enum
        call.replace("get_weather", "get_time"),  # no such tool
        call.replace("<|call|>", "}<|call|>"),  # nothing after the arguments
        f"{F}Sure.",  # a final answer instead
        call + call,  # one call per turn
    ):
        assert not walk(compiler, spec, bad), bad
    named = StructuredOutput(grammar=HarmonyParser.grammar(TOOLS, "now", False, ids))
    assert not walk(compiler, named, call)
    assert walk(compiler, named, call.replace("get_weather", "now").replace('{"city": "Oslo"}', "{}"))
    # the markers are the control tokens: their text spelling is refused
    row = np.zeros(words(compiler.vocab_size), dtype=np.uint32)
    compiler.matcher(spec, frozenset({ids["<|call|>"]})).fill(row)
    assert allowed(row, compiler.vocab_size) == {ids["<|channel|>"]}
    # after the arguments the mask offers the turn's end (a grammar must not hold `<|call|>` back itself: it
    # is a stop id, which the matcher masks until the grammar is done)
    m = compiler.matcher(spec, frozenset({ids["<|call|>"], ids["<|return|>"]}))
    for t in ids_of(compiler, call.removesuffix("<|call|>")):
        m.advance(t)
    m.fill(row)
    assert allowed(row, compiler.vocab_size) == {ids["<|call|>"], ids["<|return|>"]}
    with pytest.raises(BlazrError, match="'nope' is not in tools"):
        HarmonyParser.grammar(TOOLS, "nope", True, ids)


def test_a_response_format_holds_in_the_final_channel(compiler):
    think = ThinkFirst(harmony.THINK_START, harmony.THINK_END, lark=harmony.answer_block(control(compiler)))
    spec = StructuredOutput(
        json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}, think=think
    )
    assert walk(compiler, spec, '<|channel|>final<|message|>{"a": 1}')
    assert walk(compiler, spec, f'{A}Think.{E}{F}{{"a": 2}}')
    assert not walk(compiler, spec, '{"a":1}')  # not in a channel
    assert not walk(compiler, spec, '<|channel|>final<|message|>{"a": "x"}')
    assert not walk(compiler, spec, f"{A}Think.{E}{F}text")


# --------------------------------------------------------------------------------------------- render

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Two tools.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            },
            {"id": "c2", "type": "function", "function": {"name": "now", "arguments": {}}},
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "assistant", "content": "Sunny, noon.", "reasoning_content": "Done."},
    {"role": "user", "content": "Thanks"},
]


def test_the_gpt_oss_template_renders_calls_results_and_effort():
    tpl = ChatTemplate(TEMPLATE.read_text())
    tools = template_tools(TOOLS)
    text = tpl.render(template_messages(CONVERSATION), tools=tools, reasoning_effort=template_effort("xhigh"))
    assert "Reasoning: high" in text
    assert "type get_weather = (_: {\ncity: string,\nunit?: any,\n}) => any;" in text
    # each call its own message, followed by its own result (matched by id, whatever the order they came in);
    # the calls' reasoning is dropped once a final answer followed them (the template's rule)
    assert (
        "<|start|>user<|message|>Weather and time in Paris?<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
        "<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}<|call|>"
        '<|start|>functions.now to=assistant<|channel|>commentary<|message|>"12:00"<|end|>'
        "<|start|>assistant<|channel|>final<|message|>Sunny, noon.<|end|>"
    ) in text
    assert text.endswith("<|start|>user<|message|>Thanks<|end|><|start|>assistant")
    pending = tpl.render(template_messages(CONVERSATION[:5]), tools=tools)  # the answer not yet written
    assert (
        "<|end|><|start|>assistant<|channel|>analysis<|message|>Two tools.<|end|><|start|>assistant to="
        in pending
    )
    assert pending.count("<|start|>functions.") == 2 and "Reasoning: medium" in pending
    assert [template_effort(e) for e in ("none", "low", "medium", "max", None)] == [
        "low",
        "low",
        "medium",
        "high",
        None,
    ]


def test_the_template_stops_on_return_and_call_not_on_end(compiler):
    special = compiler.tokenizer.special_tokens
    assert compiler.tokenizer.eos_token_ids >= {special["<|return|>"], special["<|call|>"]}
    assert special["<|end|>"] not in compiler.tokenizer.eos_token_ids
