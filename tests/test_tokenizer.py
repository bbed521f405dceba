"""Tokenizer selection, encode/decode against HF references, EOS/BOS policy, streaming decode.

References: HF `transformers` (AutoTokenizer from the SmolLM2 GGUF and from its saved tokenizer.json), HF
`tokenizers`, and `sentencepiece` itself for the GGUF SentencePiece path. All offline.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import splintr

from blazr.errors import BlazrError, UnsupportedError
from blazr.tokenizer import Tokenizer, TokenizerSource, load_tokenizer, vocab_for_size
from blazr.vocab import GGUF_PRE_SPLITS, build_gguf_tokenizer_json
from tests.smollm2_reference import gguf_tokenizer_metadata, hf_tokenizer_dir

BUNDLED = ("cl100k_base", "o200k_base", "llama3", "deepseek_v3")
ROUND_TRIP = [
    "Hello, world!",
    "naïve café — “quotes” ½ ∑ 日本語のテキスト 한국어 العربية",
    "emoji 🚀🎉 family 👩‍👩‍👧 flag 🇫🇷",
    "   leading and trailing   ",
    "tabs\t\tand\n\n\nnewlines\r\n",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '{\'json\': [1, 2.5, null], "k": "v"}',
    "x = 12345678901234567890",
    "",
]
# Strings SmolLM2's tokenizers must agree on (HF built from the GGUF, HF tokenizers, llama.cpp).
SMOL_TEXTS = [
    "Hello, world!",
    "naïve café, Ünïcödé — “quotes” ∑ 日本語のテキスト 한국어",
    "emoji 🚀🎉 and 👩‍👩‍👧 family",
    "digits 1234567890 and 3.14159, 1,000,000",
    "whitespace   runs\t\ttabs\n\n\nnewlines   ",
    "contractions: I'm, you're, he'll, they've, we'd, it's, CAN'T",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>trailing<repo_name>x",
    "   leading spaces and trailing  ",
    "URL https://example.com/path?q=1&r=2#frag",
    "",
]


@pytest.fixture(scope="module")
def smol() -> tuple[dict, Path]:
    """SmolLM2's GGUF tokenizer metadata (gguf-py) and transformers' tokenizer dir saved from the GGUF."""
    return gguf_tokenizer_metadata(), hf_tokenizer_dir()


@pytest.fixture(scope="module")
def smol_hf(smol):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol[1])


@pytest.fixture(scope="module")
def smol_gguf_tok(smol) -> Tokenizer:
    return load_tokenizer(TokenizerSource(gguf_metadata=smol[0], vocab_size=49152))


@pytest.fixture(scope="module")
def smol_json_tok(smol) -> Tokenizer:
    return load_tokenizer(TokenizerSource(tokenizer_dir=smol[1], vocab_size=49152))


@pytest.fixture(scope="module")
def bundled() -> dict[str, Tokenizer]:
    return {name: load_tokenizer(TokenizerSource(vocab_name=name)) for name in BUNDLED}


# --------------------------------------------------------------------------------------------- bundled vocabs


@pytest.mark.parametrize("name", BUNDLED)
def test_round_trip_bundled(bundled, name):
    tok = bundled[name]
    assert tok.name == name
    for text in ROUND_TRIP:
        assert tok.decode(tok.encode(text)) == text
        assert tok.decode(tok.encode_ordinary(text)) == text


@pytest.mark.parametrize(
    ("vocab_size", "name"),
    [(100277, "cl100k_base"), (100331, "cl100k_base"), (128256, "llama3"), (129280, "deepseek_v3"),
     (200019, "o200k_base")],
)  # fmt: skip
def test_vocab_from_model_size(vocab_size, name):
    assert vocab_for_size(vocab_size) == name
    tok = load_tokenizer(TokenizerSource(vocab_size=vocab_size))
    assert tok.name == name
    assert splintr.base_vocab_size(name) <= tok.vocab_size  # splintr's count includes its agent tokens


def test_vocab_errors():
    with pytest.raises(BlazrError, match="no bundled vocabulary fits"):
        load_tokenizer(TokenizerSource(vocab_size=262_144))
    with pytest.raises(BlazrError, match=r"unknown vocabulary 'gpt5'.*cl100k_base.*llama3"):
        load_tokenizer(TokenizerSource(vocab_name="gpt5"))
    with pytest.raises(BlazrError, match="no tokenizer"):
        load_tokenizer(TokenizerSource())


def test_explicit_name_wins(smol):
    tok = load_tokenizer(TokenizerSource(vocab_name="llama3", tokenizer_dir=smol[1], gguf_metadata=smol[0]))
    assert tok.name == "llama3"


def test_special_tokens_in_raw_prompts(bundled):
    cl100k, llama3 = bundled["cl100k_base"], bundled["llama3"]
    assert cl100k.encode("<|endoftext|>hi") == [100257, *cl100k.encode("hi")]
    assert 100257 not in cl100k.encode_ordinary("<|endoftext|>hi")
    assert llama3.encode("<|eot_id|><|start_header_id|>") == [128009, 128006]


def test_agent_tokens_beyond_model_rows_are_plain_text():
    # A model with only cl100k's 100277 rows must never see splintr's agent ids (100277+).
    tok = load_tokenizer(TokenizerSource(vocab_name="cl100k_base", vocab_size=100277))
    ids = tok.encode("<|im_start|>user<|endoftext|>")
    assert max(ids) < 100277 and 100257 in ids
    assert max(tok.encode_chat([{"role": "user", "content": "hi"}])) < 100277
    # ...while a model with the agent rows gets them.
    full = load_tokenizer(TokenizerSource(vocab_name="cl100k_base", vocab_size=100331))
    assert full.encode("<|im_start|>") == [splintr.CL100K_AGENT_TOKENS.IM_START]


# ----------------------------------------------------------------------------------------------- SmolLM2 GGUF


def test_smollm2_gguf_matches_hf(smol, smol_hf, smol_gguf_tok):
    import tokenizers

    fast = tokenizers.Tokenizer.from_file(str(smol[1] / "tokenizer.json"))
    tok = smol_gguf_tok
    assert tok.name == "gguf:smollm" and tok.vocab_size == 49152
    for text in SMOL_TEXTS:
        ref = smol_hf.encode(text, add_special_tokens=False)
        assert tok.encode(text) == ref, text
        assert fast.encode(text, add_special_tokens=False).ids == ref, text
        assert tok.decode(ref) == smol_hf.decode(ref, skip_special_tokens=True), text
        assert tok.decode(ref, skip_special=False) == smol_hf.decode(ref), text
    plain = "<|im_start|>x"
    assert tok.encode_ordinary(plain) == [t for t in tok.encode_ordinary(plain) if t > 16]  # no control ids


def test_gguf_metadata_from_numpy_readers(smol, smol_gguf_tok):
    """Metadata may come as numpy arrays/scalars and bytes (a GGUF reader's natural types)."""
    import numpy as np

    meta = dict(smol[0])
    meta["tokenizer.ggml.token_type"] = np.asarray(meta["tokenizer.ggml.token_type"], dtype=np.int32)
    meta["tokenizer.ggml.add_bos_token"] = np.bool_(False)
    meta["tokenizer.ggml.eos_token_id"] = np.uint32(2)
    meta["tokenizer.ggml.tokens"] = [t.encode() for t in meta["tokenizer.ggml.tokens"]]
    tok = load_tokenizer(TokenizerSource(gguf_metadata=meta))
    text = SMOL_TEXTS[7]
    assert tok.encode(text) == smol_gguf_tok.encode(text) and tok.eos_token_ids == smol_gguf_tok.eos_token_ids


def test_smollm2_tokenizer_json_matches_hf(smol, smol_hf, smol_json_tok):
    import tokenizers

    fast = tokenizers.Tokenizer.from_file(str(smol[1] / "tokenizer.json"))
    tok = smol_json_tok
    assert tok.name == "tokenizer.json"
    for text in [*SMOL_TEXTS, "x   22", "\n 7"]:
        ref = smol_hf.encode(text, add_special_tokens=False)
        assert tok.encode(text) == ref == fast.encode(text, add_special_tokens=False).ids, text


def test_smollm2_gguf_splits_digits_like_llama_cpp(smol, smol_hf, smol_gguf_tok):
    """pre=smollm isolates every digit before the GPT-2 split (llama.cpp, and SmolLM2's own tokenizer.json:
    Digits(individual) + ByteLevel). transformers' GGUF loader uses plain ByteLevel, which differs only
    where a whitespace run precedes a digit."""
    import tokenizers

    doc = json.loads((smol[1] / "tokenizer.json").read_text())
    doc["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }
    original = tokenizers.Tokenizer.from_str(json.dumps(doc))
    for text in ["x   22", "\n 7", "a  1", "hello  12345 world", "half ½", *SMOL_TEXTS]:
        assert smol_gguf_tok.encode(text) == original.encode(text, add_special_tokens=False).ids, text
    assert smol_gguf_tok.encode("x   22") != smol_hf.encode("x   22", add_special_tokens=False)


@pytest.fixture(scope="module")
def small_vocab_meta(smol) -> dict:
    """SmolLM2's GGUF vocabulary cut to its first 6000 tokens (and the merges among them): quick to load."""
    meta, n = smol[0], 6000
    tokens = meta["tokenizer.ggml.tokens"][:n]
    kept = set(tokens)
    merges = [m for m in meta["tokenizer.ggml.merges"] if m.replace(" ", "") in kept]
    types = meta["tokenizer.ggml.token_type"][:n]
    return dict(
        meta,
        **{
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
        },
    )


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "qwen35", "deepseek-v3", "gpt2", "gpt-4o", "tekken"])
def test_gguf_pre_tokenizers_agree_with_hf_tokenizers(small_vocab_meta, pre):
    """Each `tokenizer.ggml.pre` regex family runs the same in splintr as in HF tokenizers."""
    import tokenizers

    meta = dict(small_vocab_meta, **{"tokenizer.ggml.pre": pre})
    doc = build_gguf_tokenizer_json(meta)
    hf = tokenizers.Tokenizer.from_str(doc.decode())
    tok = load_tokenizer(TokenizerSource(gguf_metadata=meta))
    texts = [
        *SMOL_TEXTS,
        "x   22 123456 日本語カタカナ ひらがな",
        "Don't STOP'S \r\n\r\n  -->  $$$ a.b/c",
        "\u0301e",
    ]
    for text in texts:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, (pre, text)
    assert GGUF_PRE_SPLITS[pre]


def test_gguf_pre_tokenizer_regexes():
    import tokenizers

    def pieces(pre: str, text: str) -> list[str]:
        splits = GGUF_PRE_SPLITS[pre]
        seq = tokenizers.pre_tokenizers.Sequence(
            [tokenizers.pre_tokenizers.Split(tokenizers.Regex(r), "isolated") for r in splits]
        )
        return [p for p, _ in seq.pre_tokenize_str(text)]

    assert pieces("llama-bpe", "12345") == ["123", "45"]
    assert pieces("qwen2", "12345") == ["1", "2", "3", "4", "5"]
    assert pieces("smollm", "  12") == ["  ", "1", "2"]
    assert pieces("deepseek-v3", "1234日本語abc") == ["123", "4", "日本語", "abc"]


def test_gguf_vocab_spelling_repeats_and_spaced_merges(small_vocab_meta):
    """A NORMAL token written as text is respelled in GPT-2's byte alphabet (HF's ByteLevel is the reference),
    a repeated spelling keeps its first id, and merges stay GGUF's "a b" strings unless a token holds a space
    (then every merge is split at its first space, as llama.cpp reads them)."""
    import tokenizers

    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    spelled = byte_level.pre_tokenize_str("日本")[0][0]
    meta = dict(small_vocab_meta)
    n = len(meta["tokenizer.ggml.tokens"])
    assert spelled not in meta["tokenizer.ggml.tokens"]
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], "日本", spelled, "<ctl>"]
    meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], 1, 1, 3]
    doc = json.loads(build_gguf_tokenizer_json(meta))
    assert doc["model"]["vocab"][spelled] == n  # respelled, and the first of the two spellings wins
    assert "日本" not in doc["model"]["vocab"]
    assert doc["added_tokens"][-1]["content"] == "<ctl>" and doc["added_tokens"][-1]["id"] == n + 2
    assert doc["model"]["merges"] == meta["tokenizer.ggml.merges"]

    meta["tokenizer.ggml.merges"] = [*meta["tokenizer.ggml.merges"], "a b c"]
    merges = json.loads(build_gguf_tokenizer_json(meta))["model"]["merges"]
    assert merges[-1] == ["a", "b c"]
    assert merges[:-1] == [m.split(" ") for m in small_vocab_meta["tokenizer.ggml.merges"]]


# ------------------------------------------------------------------------------------------- BOS / EOS policy


def test_eos_and_bos_smollm2(smol_gguf_tok, smol_json_tok):
    for tok in (smol_gguf_tok, smol_json_tok):
        assert 2 in tok.eos_token_ids  # <|im_end|>: the GGUF's EOS, tokenizer_config's, and the template's
        assert tok.bos_token_id == 1 and tok.add_bos is False
        assert tok.encode("hi")[0] != 1
        assert tok.encode_chat([{"role": "user", "content": "hi"}])[0] == 1  # the template's own <|im_start|>


def test_eos_and_bos_llama3():
    given = load_tokenizer(TokenizerSource(vocab_name="llama3", eos_token_ids=(128001, 128008, 128009)))
    assert {128001, 128008, 128009} <= given.eos_token_ids
    # The Llama-3 template's end of turn is a stop id even when generation_config gave none.
    assert 128009 in load_tokenizer(TokenizerSource(vocab_name="llama3")).eos_token_ids
    assert given.bos_token_id == 128000 and not given.add_bos
    assert given.encode("hi") == [6151]
    with_bos = load_tokenizer(TokenizerSource(vocab_name="llama3", add_bos_token=True))
    assert with_bos.encode("hi") == [128000, 6151]
    chat = with_bos.encode_chat([{"role": "user", "content": "hi"}])
    assert chat[:2] == [128000, 128006]  # the template writes BOS; it is not doubled


def test_bos_from_tokenizer_files(small_vocab_meta, tmp_path):
    """A tokenizer.json whose post_processor prepends a BOS means add_bos, unless tokenizer_config says no."""
    doc = json.loads(build_gguf_tokenizer_json(small_vocab_meta))
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    raw = splintr.from_json(str(tmp_path / "tokenizer.json"))
    hi = raw.encode_raw("hi there")
    assert raw.encode_ordinary("hi there") == [1, *hi]  # the splintr quirk we work around
    tok = load_tokenizer(TokenizerSource(tokenizer_dir=tmp_path))
    assert tok.add_bos and tok.bos_token_id == 1
    assert tok.encode("hi there") == [1, *hi]
    assert tok.encode_ordinary("hi there") == hi  # we dropped the post_processor, so no BOS here
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    assert load_tokenizer(TokenizerSource(tokenizer_dir=tmp_path)).encode("hi there") == hi
    forced = load_tokenizer(TokenizerSource(tokenizer_dir=tmp_path, add_bos_token=True))
    assert forced.encode("hi there") == [1, *hi]


# ------------------------------------------------------------------------------------------ decode, streaming


def _stream(tok: Tokenizer, ids: list[int], skip_special: bool = True) -> tuple[str, list[str]]:
    decoder = tok.stream(skip_special)
    chunks = [decoder.add(i) for i in ids]
    return "".join(chunks) + decoder.flush(), chunks


@pytest.mark.parametrize("name", [*BUNDLED, "smollm2"])
def test_streaming_decode_equals_decode(bundled, smol_gguf_tok, name):
    tok = smol_gguf_tok if name == "smollm2" else bundled[name]
    for text in ROUND_TRIP:
        ids = tok.encode(text)
        assert _stream(tok, ids)[0] == tok.decode(ids) == text
    ids = tok.encode_ordinary("🚀")
    assert len(ids) > 1  # the emoji spans several tokens...
    text, chunks = _stream(tok, ids)
    assert text == "🚀" and chunks[0] == ""  # ...and nothing is emitted until it is complete


def test_streaming_with_specials(smol_gguf_tok):
    ids = smol_gguf_tok.encode("<|im_start|>assistant\nHi 👋<|im_end|>")
    assert _stream(smol_gguf_tok, ids)[0] == "assistant\nHi 👋"
    assert _stream(smol_gguf_tok, ids, skip_special=False)[0] == "<|im_start|>assistant\nHi 👋<|im_end|>"


@pytest.mark.parametrize("skip_special", [True, False])
def test_stream_decoders_are_reused_reset_and_never_shared(smol_json_tok, skip_special):
    """splintr's decoder of a tokenizer.json vocabulary carries its own copy of it (5 ms, 2.5 MB to make), so
    a released one goes back to the tokenizer's pool: the next stream takes the same one, reset — even when
    the last sequence left it mid-character —, and streams alive at once never share one."""
    tok = smol_json_tok
    word, emoji = tok.encode_ordinary("Hi"), tok.encode_ordinary("🚀")
    first = tok.stream(skip_special)
    native = first._native
    assert native is not None and len(emoji) > 1
    assert first.add(emoji[0]) == ""  # a character begun, never finished: the sequence was aborted
    del first
    again = tok.stream(skip_special)
    assert again._native is native  # reused…
    other = tok.stream(skip_special)
    other_native = other._native
    assert other_native is not native  # …but by one stream at a time
    texts = {id(again): "", id(other): ""}
    for a, b in zip(emoji, [*word, *[None] * len(emoji)], strict=False):  # interleaved, as a batch steps
        texts[id(again)] += again.add(a)
        if b is not None:
            texts[id(other)] += other.add(b)
    assert texts[id(again)] + again.flush() == "🚀"  # nothing left over from the aborted sequence
    assert texts[id(other)] + other.flush() == "Hi"
    del again, other
    idle = tok._decoders[skip_special]._idle
    assert any(d is native for d in idle) and any(d is other_native for d in idle)  # both back


def test_redecode_stream_fallback(smol_gguf_tok, bundled):
    """The sliding-window decoder used when splintr cannot stream a tokenizer.json's decoder."""
    for tok in (smol_gguf_tok, bundled["llama3"]):
        for text in [*ROUND_TRIP, "🚀🎉👩‍👩‍👧 done"]:
            ids = tok.encode(text)
            decoder = tok.stream()
            decoder._native = None
            assert "".join(decoder.add(i) for i in ids) + decoder.flush() == text


def test_decode_is_lenient(bundled):
    llama3 = bundled["llama3"]
    ids = llama3.encode("hi")
    # 128100 is a reserved id splintr has no entry for; 10**6 is past the vocabulary.
    assert llama3.decode([*ids, 128100, 10**6, *ids]) == "hihi"
    cl100k = bundled["cl100k_base"]
    partial = cl100k.encode("🚀")[:2]
    assert cl100k.decode(partial) == "\ufffd"  # splintr raises here; we replace like HF
    assert cl100k.decode([100257, *partial], skip_special=False) == "<|endoftext|>\ufffd"


def test_token_text_and_bytes(bundled, smol_gguf_tok):
    llama3 = bundled["llama3"]
    assert llama3.token_text(128009) == "<|eot_id|>"
    assert llama3.token_text(llama3.encode("hello")[0]) == "hello"
    first = bundled["cl100k_base"].encode("🚀")[0]
    head = bundled["cl100k_base"].token_bytes(first)
    assert 0 < len(head) < 4 and "🚀".encode().startswith(head)
    assert bundled["cl100k_base"].token_text(first) == "\ufffd"
    assert smol_gguf_tok.token_text(2) == "<|im_end|>"
    assert smol_gguf_tok.token_text(smol_gguf_tok.encode(" world")[0]) == " world"
    assert llama3.token_bytes(10**7) == b""


# ------------------------------------------------------------------------------- GGUF SentencePiece (llama)

SPM_CONTROL = ("<|im_start|>", "<|im_end|>")


@pytest.fixture(scope="module")
def spm():
    """A tiny SentencePiece BPE model (byte fallback, like Llama 2) and its GGUF-style metadata."""
    import random

    import sentencepiece

    rng = random.Random(0)
    words = (
        "the quick brown fox jumps over lazy dog hello world python code def naïve café 日本 12 (x) [y]: {z};"
    )
    lines = [" ".join(rng.choice(words.split()) for _ in range(rng.randint(3, 15))) for _ in range(2000)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=500, model_type="bpe",
        byte_fallback=True, user_defined_symbols=["<think>"], control_symbols=list(SPM_CONTROL),
        character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False, minloglevel=2,
        num_threads=1,
    )  # fmt: skip
    sp = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]

    def kind(i: int) -> int:
        if sp.is_unknown(i):
            return 2
        if sp.is_control(i):
            return 3
        if sp.is_byte(i):
            return 6
        return 4 if pieces[i] == "<think>" else 1

    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": pieces,
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(n)],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}",
    }
    return sp, meta


def test_gguf_sentencepiece_matches_sentencepiece(spm):
    sp, meta = spm
    tok = load_tokenizer(TokenizerSource(gguf_metadata=meta))
    assert tok.name == "gguf:llama" and tok.add_bos and tok.bos_token_id == 1 and 2 in tok.eos_token_ids
    texts = [
        "hello world",
        " hello",
        "  hello  world ",
        "naïve café 日本",
        "🚀 emoji ŋ",
        "12 345",
        "a\tb\n\n",
    ]
    for text in texts:
        assert tok.encode_ordinary(text) == sp.encode(text), text
        assert tok.encode(text) == [1, *sp.encode(text)], text
        assert tok.decode(tok.encode(text)) == sp.decode(sp.encode(text)) == text, text
        assert _stream(tok, tok.encode(text))[0] == text
    im_start = sp.piece_to_id("<|im_start|>")
    # Control tokens written in a raw prompt are matched (llama.cpp parse_special); never by encode_ordinary.
    assert tok.encode("<|im_start|>hello") == [1, im_start, *sp.encode("hello")]
    assert im_start not in tok.encode_ordinary("<|im_start|>hello")
    assert tok.decode(tok.encode("<|im_start|>hello")) == "hello"
    assert "<|im_start|>" in tok.decode(tok.encode("<|im_start|>hello"), skip_special=False)
    chat = tok.encode_chat([{"role": "user", "content": "hi <|im_end|>"}])
    assert chat.count(sp.piece_to_id("<|im_end|>")) == 1 and chat[:2] == [1, im_start]


def test_gguf_unsupported(spm):
    """(A vocabulary without the dummy prefix is supported: test_gemma3_real.py checks Gemma 3's against
    llama.cpp.)"""
    _, meta = spm
    with pytest.raises(UnsupportedError, match="'t5'"):
        load_tokenizer(TokenizerSource(gguf_metadata=dict(meta, **{"tokenizer.ggml.model": "t5"})))
