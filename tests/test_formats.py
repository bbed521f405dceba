"""The weight-format table (kernels/formats.py) against everything that spells a format elsewhere: the C
header's enums (kind, row, op and element codes), the GGUF type table (block geometry), the lists the
bindings and quant.py derive, and the command line's --quantize choices."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from blazr.kernels import bindings, bindings_weights, formats, quant
from blazr.kernels.formats import FORMATS, OP_LINEAR_Q
from blazr.loading import gguf, quantize
from blazr.loading.gguf_header import GGML_SIZES

HEADER = Path(formats.__file__).parent / "csrc" / "blazr_kernels.h"


def _c_enums() -> dict[str, int]:
    """Every `NAME = value` of an enum in blazr_kernels.h."""
    text = HEADER.read_text()
    found = {}
    for body in re.findall(r"enum\s*\{(.*?)\}", text, flags=re.S):
        for name, value in re.findall(r"(BLZ_[A-Z0-9_]+)\s*=\s*(BLZ_[A-Z0-9_]+|\d+)", body):
            found[name] = found[value] if value.startswith("BLZ_") else int(value)
    return found


def test_codes_equal_the_c_header() -> None:
    c = _c_enums()
    ops = {k: f"BLZ_OP_LINEAR_{k.upper()}" for k in ("q", "f32", "bf16", "f16")}
    for f in FORMATS:
        assert f.op == c[ops["q" if f.op == OP_LINEAR_Q else f.kind]], f.kind
        if f.layout != "float":
            assert f.c_kind == c[f.c_name], f.kind
        if f.row_code is not None:  # a table kind: its block kind's code, or BLZ_ROW_F16 / BF16
            assert f.row_code == c[f.c_name if f.layout != "float" else "BLZ_ROW_" + f.kind.upper()], f.kind
    kv = {torch.float32: "BLZ_KV_F32", torch.bfloat16: "BLZ_KV_BF16", torch.float16: "BLZ_KV_F16"}
    assert {dtype: c[name] for dtype, name in kv.items()} == formats.ELEMENT_CODES
    # every weight-kind constant of the header is a format's (a C kind no table row names would be dead)
    c_kinds = {name for name in c if re.fullmatch(r"BLZ_(Q\d_\w+|KMIX|MXFP4|BF16Z|F32Z)", name)}
    assert c_kinds == {f.c_name for f in FORMATS if f.layout != "float"}


def test_block_geometry_equals_the_ggml_types() -> None:
    for f in FORMATS:
        if f.ggml is None:
            continue
        values, nbytes = GGML_SIZES[f.ggml]
        assert (values, nbytes) == (f.block, f.block_bytes), f.kind


def test_derived_lists() -> None:
    """quant.py's lists, the bindings' code tables and the loader's kept / dequantized types are views of the
    table (what they held before the table, value for value)."""
    want_floats = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    want_kinds = (
        "q4_0",
        "q4_1",
        "q8_0",
        "q8_0g",
        "q4_k",
        "q5_k",
        "q6_k",
        "kmix",
        "q4_kx",
        "q5_kx",
        "q6_kx",
        "mxfp4",
        "q5_0",
        "bf16z",
        "f32z",
        *want_floats,
    )
    want_ggml = {t: t.lower() for t in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "Q5_0")}
    assert quant.BLOCK_BYTES == {"q4_0": 18, "q4_1": 20, "q8_0": 34}
    assert quant.KQUANT_BYTES == {"q4_k": 144, "q5_k": 176, "q6_k": 210}
    assert quant.KX_KINDS == ("q4_kx", "q5_kx", "q6_kx")  # re-laid K-quants only: no GGML type of their own
    assert (want_floats, want_kinds) == (quant.FLOAT_KINDS, quant.KINDS)
    assert {**want_ggml, "BF16": "bf16", "F16": "f16", "F32": "f32"} == quant.GGML_KINDS
    assert quant.AS_STORED == {"q8_0": "q8_0g"}
    assert set(bindings._OP_LINEAR) == set(quant.KINDS) == set(bindings_weights._KIND_CODES)
    rows = {"q4_0", "q4_1", "q8_0", "q4_k", "q5_k", "q6_k", "q5_0", "f16", "bf16", "bf16z", "f32z"}
    assert set(bindings._ROW_CODES) == rows
    assert want_ggml == gguf._C_KINDS


def test_quantize_modes_and_the_command_line() -> None:
    """--quantize's choices are loading/quantize.py's MODES, and each in-situ mode makes a format's kind."""
    from blazr import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    choices = {tuple(a.choices) for p in sub.choices.values() for a in p._actions if a.dest == "quantize"}
    assert choices == {quantize.MODES}
    assert all(kind in formats.BY_KIND for kind in quantize._ISQ_KIND.values())
