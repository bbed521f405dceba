"""The prebuilt text-delta chunk (server/chunks.py) against its reference, the pydantic schemas: byte for
byte, for both endpoints, every usage mode, and texts that need JSON escaping."""

from __future__ import annotations

import json
import random

import pytest

from blazr.server.chunks import ChunkEncoder, usage, usage_mode
from blazr.server.schemas import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionChunk,
    DeltaMessage,
    StreamOptions,
)

TEXTS = [
    "",
    " hello",
    'quote " backslash \\ slash /',
    "".join(chr(c) for c in range(32)),  # every control character
    "\x7f del, \u2028 line separator, \u2029 paragraph",
    "naïve café — 東京 🚀 \U0001f600",
    "</script><!-- & ' < >",
    "\ud7ff\ue000\uffff",
]


def _random_texts(n: int) -> list[str]:
    rng = random.Random(0)
    pool = [chr(c) for c in (*range(0, 200), *range(0x370, 0x3FF), 0x2028, 0x4E2D, 0x1F680, 0xFFFD)]
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def _reference(kind: type, rid: str, model: str, index: int, text: str, u: object) -> object:
    if kind is ChatCompletionChunk:
        choice = ChatChunkChoice(index=index, delta=DeltaMessage(content=text))
    else:
        choice = CompletionChoice(index=index, text=text)
    return kind(id=rid, created=1732400000, model=model, choices=[choice], usage=u)


@pytest.mark.parametrize("kind", [ChatCompletionChunk, CompletionChunk])
@pytest.mark.parametrize("mode", ["off", "final", "continuous"])
def test_text_chunk_equals_the_schema_dump(kind: type, mode: str) -> None:
    for rid, model in [("chatcmpl-abc123", "SmolLM2"), ('id "quoted" \\', "modèle/名前")]:
        enc = ChunkEncoder(kind, rid, 1732400000, model, mode)  # type: ignore[arg-type]
        for i, text in enumerate([*TEXTS, *_random_texts(200)]):
            index = i % 3
            u = usage(17, i + 1, 16 * (i % 2)) if mode == "continuous" else None
            fast = enc.text(index, text, u)
            ref = enc.event(_reference(kind, rid, model, index, text, u))  # type: ignore[arg-type]
            assert fast == ref, (text, fast, ref)
            body = json.loads(fast.removeprefix(b"data: ").removesuffix(b"\n\n"))
            got = (
                body["choices"][0]["delta"]["content"]
                if kind is ChatCompletionChunk
                else body["choices"][0]["text"]
            )
            assert got == text
            assert ("usage" in body) == (mode != "off")


def test_event_usage_key_follows_the_mode() -> None:
    chunk = CompletionChunk(id="x", created=1, model="m", choices=[], usage=usage(3, 4, 0))
    off = ChunkEncoder(CompletionChunk, "x", 1, "m", "off").event(chunk)
    final = ChunkEncoder(CompletionChunk, "x", 1, "m", "final").event(chunk)
    assert b"usage" not in off
    assert json.loads(final[6:])["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},  # present even when nothing was cached
    }


@pytest.mark.parametrize("kind", [ChatCompletionChunk, CompletionChunk])
def test_continuous_usage_carries_the_cached_tokens(kind: type) -> None:
    """The prebuilt bytes hold `prompt_tokens_details.cached_tokens` as the schema writes it, and the
    official client reads it back."""
    from openai.types import CompletionUsage

    enc = ChunkEncoder(kind, "x", 1732400000, "m", "continuous")  # type: ignore[arg-type]
    for cached in (0, 16, 1024):
        u = usage(1030, 5, cached)
        fast = enc.text(1, "hi", u)
        assert fast == enc.event(_reference(kind, "x", "m", 1, "hi", u))  # type: ignore[arg-type]
        body = json.loads(fast.removeprefix(b"data: "))
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
        details = CompletionUsage.model_validate(body["usage"]).prompt_tokens_details  # both endpoints' type
        assert details is not None and details.cached_tokens == cached


def test_usage_mode_from_stream_options() -> None:
    assert usage_mode(None) == "off"
    assert usage_mode(StreamOptions()) == "off"
    assert usage_mode(StreamOptions(continuous_usage_stats=True)) == "off"  # only with include_usage
    assert usage_mode(StreamOptions(include_usage=True)) == "final"
    assert usage_mode(StreamOptions(include_usage=True, continuous_usage_stats=True)) == "continuous"


@pytest.mark.parametrize("kind", [ChatCompletionChunk, CompletionChunk])
def test_every_event_is_one_line_for_line_readers(kind: type) -> None:
    """NEL, LINE and PARAGRAPH SEPARATOR are line breaks to `str.splitlines()` — and so to httpx's
    `aiter_lines`, which guidellm reads streams with (a token holding one broke its JSON). Escaped in both
    paths: each event is one line to such readers, and still decodes to the same text."""
    import httpx

    text = "a\x85b\u2028c\u2029d\x0be\x1cf\r\ng"
    enc = ChunkEncoder(kind, "x", 1, "m\u2028", "final")  # type: ignore[arg-type]
    for event in (enc.text(0, text), enc.event(_reference(kind, "x", "m\u2028", 0, text, None))):
        assert event.decode().splitlines() == [event.decode().removesuffix("\n\n"), ""]
        lines = httpx.Response(200, content=event + b"data: [DONE]\n\n").iter_lines()
        data = [line for line in lines if line]
        assert len(data) == 2 and data[1] == "data: [DONE]"
        body = json.loads(data[0].removeprefix("data: "))
        choice = body["choices"][0]
        assert (choice["delta"]["content"] if kind is ChatCompletionChunk else choice["text"]) == text
        assert body["model"] == "m\u2028"
