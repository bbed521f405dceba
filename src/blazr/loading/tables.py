"""Token tables at load — the token embedding and Gemma 4's per-layer table — as RowTables whose lookups read
only their rows (model/embedding.py `QuantizedEmbedding`): a GGUF's table as stored (`auto`: a view of the
file's map), Q8_0 / bf16 rows quantized in situ from the checkpoint under `--quantize int8 / int4 / bf16`
(loading/quantize.py `in_situ`, the quantization cache included), a 16-bit checkpoint's per-layer rows as
stored, or, for a tensor-parallel rank's table already loaded in float32, its rows made from that
(`table_from_loaded`). No float32 copy of a table in any mode. The loader (loading/loader.py) calls these
around the linears of loading/quantize.py: `embed_quantized` first, so that `int8`'s tied head reads the
table's Q8_0 rows.
"""

from __future__ import annotations

import torch

from blazr.kernels.quant import FLOAT_KINDS, GGML_KINDS, Q8_0G, QK, quantize
from blazr.kernels.row_table import ROW_KINDS, RowTable
from blazr.loading.quantize import in_situ
from blazr.loading.stored import is_copy, row_sources
from blazr.loading.weights import WeightLoader
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.model import CausalLM


def embed_from_file(model: CausalLM, loader: WeightLoader) -> str | None:
    """Keep the token embedding table of `model` (still on meta) as the GGUF stores it, when its tensor is
    one of `ROW_KINDS` and needs no transform: a QuantizedEmbedding over a view of the file's map, whose
    lookups dequantize only their rows (`auto`; no float copy of the table). Returns its kind, or None
    (the table is then loaded float with the rest)."""
    cfg = model.cfg
    if model.tp is not None:
        return None
    table = _stored_table(loader, "embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))
    if table is None:
        return None
    model.embed_tokens = QuantizedEmbedding(table)
    loader.tick()
    return table.kind


def _stored_table(loader: WeightLoader, pname: str, shape: tuple[int, int]) -> RowTable | None:
    """Table parameter `pname` [V, D] as a GGUF stores it — a RowTable over a view of the file's map — when
    its one tensor is of a `ROW_KINDS` type and needs no transform; else None."""
    source = loader.source
    load_raw = getattr(source, "load_raw", None)
    sources = row_sources(loader.cfg, source, loader.names, pname, shape, is_stacked=False)
    if load_raw is None or sources is None or len(sources) != 1:
        return None
    if sources[0][1] is not None:  # a table is never reordered; nothing else is expected here
        return None
    ggml_type, raw = load_raw(sources[0][0])
    kind = GGML_KINDS.get(ggml_type)
    if kind not in ROW_KINDS or raw.shape[0] != shape[0]:
        return None
    loader.consume(pname, shape, is_copied=is_copy(source, raw))
    return RowTable(kind, raw.contiguous(), *shape)


def per_layer_table(model: CausalLM, loader: WeightLoader, mode: str) -> str | None:
    """Gemma 4's per-layer table [V', L·P] (model/per_layer.py; 262144 × 8960 at E2B: 9.4 GB as float32, most
    of the checkpoint) as a QuantizedEmbedding whose lookups read only their rows: a GGUF's rows as stored
    (`auto`), Q8_0 / bf16 rows under `int8` / `int4` / `bf16` (as `embed_quantized` makes the token table's),
    else a 16-bit checkpoint's own rows (a view of its map; a lookup widens them to float32 exactly, so the
    values are those of the float table). Returns its kind, or None (the table then loads float: a float32
    checkpoint without --quantize)."""
    pli = model.per_layer_inputs
    if pli is None or model.tp is not None:
        return None
    pname, shape = "per_layer_inputs.embed.weight", (pli.cfg.vocab_size, pli.num_layers * pli.cfg.size)
    table = _stored_table(loader, pname, shape) if mode == "auto" else None
    if table is None and mode in _TABLE_KIND and (_TABLE_KIND[mode] == "bf16" or shape[1] % QK == 0):
        table = _quantized_table(loader, pname, shape, _TABLE_KIND[mode])
    stored = loader.stored_dtype(pname, shape) if table is None else None
    if stored in (torch.bfloat16, torch.float16):
        kind = next(k for k, dtype in FLOAT_KINDS.items() if dtype == stored)
        table = RowTable(kind, loader.parameter(pname, shape, stored).view(torch.uint8), *shape)
    if table is None:
        return None
    pli.embed = QuantizedEmbedding(table)
    loader.tick()
    return table.kind


# The token table's kind under `--quantize`: 8 bits in the 4-bit mode too (llama.cpp's Q4 mixes keep theirs
# at Q6_K / Q8_0: a table row is a token's whole input).
_TABLE_KIND = {"int8": "q8_0", "int4": "q8_0", "bf16": "bf16"}


def embed_quantized(model: CausalLM, loader: WeightLoader, mode: str) -> str | None:
    """`--quantize int8 / int4 / bf16`: the token table of `model` (still on meta) as a QuantizedEmbedding
    of `_TABLE_KIND[mode]` — Q8_0 rows quantized straight from the checkpoint's map into ggml's row order
    (`quantize_rows` to q8_0g, no float copy), or the bf16 values (a view of the map when stored bf16) —
    instead of a float32 table. Runs before `quantize_from_file`, whose tied head then reads the same Q8_0
    rows (`int8`) or quantizes its own copy from the checkpoint. Returns the table's kind, or None (the
    table then stays float)."""
    if mode not in _TABLE_KIND or model.tp is not None:
        return None
    cfg, kind = model.cfg, _TABLE_KIND[mode]
    pname, shape = "embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size)
    if kind != "bf16" and shape[1] % QK:  # Q8_0 quantizes blocks of 32
        return None
    model.embed_tokens = QuantizedEmbedding(_quantized_table(loader, pname, shape, kind))
    loader.tick()
    return kind


def _quantized_table(loader: WeightLoader, pname: str, shape: tuple[int, int], kind: str) -> RowTable:
    """Table parameter `pname` [V, D] as a RowTable of `kind`: Q8_0 rows in ggml's order (quantized in situ
    to q8_0g), or the bf16 values (a view of the map when stored so)."""
    data = in_situ(loader, pname, shape, Q8_0G if kind != "bf16" else "bf16").data
    return RowTable(kind, data.contiguous().view(torch.uint8), *shape)


def _table_bytes(table: torch.Tensor, kind: str) -> torch.Tensor:
    """A float table [V, D] as the bytes of a `kind` RowTable: its bf16 values, or its Q8_0 rows in ggml's
    order (D a multiple of 32)."""
    if kind == "bf16":
        return table.to(torch.bfloat16).view(torch.uint8)
    return quantize(table, kind).ggml_blocks()


def table_from_loaded(model: CausalLM, mode: str) -> str | None:
    """A model already loaded in float32 (a tensor-parallel shard, after loading/quantize.py
    `quantize_loaded`): its token table made `_TABLE_KIND[mode]` rows as `embed_quantized` makes them.
    Returns the table's kind, or None (another mode, or rows not of whole Q8_0 blocks: it stays float)."""
    if mode not in _TABLE_KIND:
        return None
    table = model.embed_tokens.weight.detach()  # the rank's rows: the same rows as one process's table
    if (row_kind := _TABLE_KIND[mode]) != "bf16" and table.shape[1] % QK:  # Q8_0 quantizes blocks of 32
        return None
    data = _table_bytes(table, row_kind)
    model.embed_tokens = QuantizedEmbedding(RowTable(row_kind, data.contiguous(), *table.shape))
    return row_kind
