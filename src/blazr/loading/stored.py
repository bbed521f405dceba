"""Weights made from where their rows lie in a checkpoint's memory map, never through a float tensor per
part (loading/quantize.py decides which weight takes which path):
- `row_sources` / `row_addresses`: the checkpoint tensors a parameter is made of (itself, its fused parts,
  an expert stack) and the address of each of its rows in the map, in the parameter's row order;
- `gguf_blocks`: a GGUF's tensors kept as stored (`auto`) — Q4_0 / Q4_1 packed straight from the map, Q8_0,
  K-quant, MXFP4 and 16-bit rows a view of the map, a MappedWeight (a row table) or one gathered copy;
- `mxfp4_as_stored`: an HF checkpoint's MXFP4 pair (`*_blocks` / `*_scales`, GPT-OSS's experts) as an mxfp4
  weight (`auto`): its blocks re-laid in GGUF's order, never dequantized;
- `quantized_in_place`: float rows quantized by the C kernel where they lie (`--quantize int8|int4`);
- `bf16_as_stored`: bf16 rows used as stored (`--quantize bf16` on a bf16 checkpoint);
- `runs` / `is_copy`: how rows lie, and whether a weight's bytes were copied out (its pages then dropped).
"""

from __future__ import annotations

import math

import torch

from blazr.config import ModelConfig
from blazr.errors import CheckpointError
from blazr.kernels import mxfp4
from blazr.kernels import ops as kernel_ops
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import (
    AS_STORED,
    BLOCK_BYTES,
    GGML_BLOCK_KINDS,
    GGML_KINDS,
    K_KINDS,
    MIX_KINDS,
    MXFP4,
    Q8_0G,
    QuantizedWeight,
    row_bytes,
)
from blazr.kernels.row_table import ROW_KINDS
from blazr.loading.names import NameMap, Reshaping, RowOrder, cat_rows, unfuse
from blazr.loading.weights import TensorSource, WeightLoader

# Kinds whose fused parts lying apart the loader leaves in the map as a MappedWeight (read by row table).
MAPPED_FROM_FILE = (*GGML_BLOCK_KINDS, *K_KINDS, "f16", "bf16")
# ... only when the rows are a few runs in order (fused parts lying apart: gate|up is 2, HF's q|k|v 3); rows
# out of order within a part (a GGUF's q / k un-permuted for rope: a run per row) are gathered — read
# through the table they made the 8B Q4_K_M's decode step 3-8 % slower (three in-process A/Bs), where
# mapping gate|up alone measured the same as gathering everything (0.98-1.01); f16 q|k|v of the 1B shape
# 12 % (one row) and 28 % (4 rows) slower at the kernel, 5 % of the 4-sequence decode step, for 0.07 s of
# load (benchmarks/NOTES.md §40).
MAX_MAPPED_RUNS = 4

# GGUF types `auto` keeps as stored: the block kinds (Q4_0 .. Q8_0, Q4_K .. Q6_K, MXFP4), the 16-bit floats.
_KEPT_TYPES = {t for t, kind in GGML_KINDS.items() if kind != "f32"}
# GGUF types whose tensors may be fused parts of one kmix weight (K-quants, Q8_0 as q8_0g, MXFP4, Q5_0).
_MIX_TYPES = {t for t, kind in GGML_KINDS.items() if AS_STORED.get(kind, kind) in MIX_KINDS}
# Stored float types whose rows the C quantizer reads in place (quantize_rows).
_FLOAT_TYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def row_sources(
    cfg: ModelConfig,
    source: TensorSource,
    names: NameMap,
    pname: str,
    shape: tuple[int, ...],
    is_stacked: bool,
) -> list[tuple[str, RowOrder | None]] | None:
    """The checkpoint tensors whose rows, concatenated, are parameter `pname` [*, K] — itself, its fused
    parts (q|k|v, gate|up), or with `is_stacked` the experts of a 3-D stack [E, N, K] read as [E·N, K] —
    each with the row order to apply to its rows (DeepSeek's rope rows), when no part needs another
    transform; else None."""
    whole = names.source(pname)
    if whole is not None and whole[0] in source.names:
        found = [whole]
    else:
        parts, combine = unfuse(cfg, pname, shape)
        if combine is not cat_rows and not is_stacked:  # an expert stack: its parts' rows in order
            return None
        found = [names.source(p.name) for p in parts]
    if any(s is None or not isinstance(s[1], RowOrder | None) or s[0] not in source.names for s in found):
        return None
    return found  # type: ignore[return-value]


def _reordered(rows: torch.Tensor, order: RowOrder | None) -> torch.Tensor:
    """A tensor indexed by rows (stored bytes [R, X], or addresses [R]) in `order`."""
    if order is None:
        return rows
    return order(rows.unsqueeze(1)).reshape(-1) if rows.dim() == 1 else order(rows)


def row_addresses(
    source: TensorSource, sources: list[tuple[str, RowOrder | None]], shape: tuple[int, ...]
) -> tuple[str, torch.Tensor] | None:
    """(stored type name, int64 [rows]) — where each row of the weight [*, K] made of `sources`' rows lies
    in the checkpoint's map (`row_addresses`), each source's rows in its row order — when they are all one
    type and add up to the weight's shape; else None (also without the kernel library, the only reader of
    addresses)."""
    row_addresses = getattr(source, "row_addresses", None)
    if row_addresses is None or kernel_ops.kernels() is None:
        return None
    found = [row_addresses(name) for name, _ in sources]
    if any(f is None for f in found) or len({f[0] for f in found}) != 1:  # type: ignore[index]
        return None
    if any(source.shape(name)[-1] != shape[-1] for name, _ in sources):
        return None
    orders = [order for _, order in sources]
    rows = torch.cat([_reordered(f[1], o) for f, o in zip(found, orders, strict=True)])  # type: ignore[index]
    return (found[0][0], rows) if rows.numel() == math.prod(shape[:-1]) else None  # type: ignore[index]


def _check_sizes(
    source: TensorSource, sources: list[tuple[str, RowOrder | None]], pname: str, shape: tuple[int, ...]
) -> None:
    """The stored tensors hold the rows parameter `pname` [*, K] takes, or one line naming them (before any
    weight format's own size check): each part K wide, the parts' rows adding up to the parameter's — a part
    that picks rows of a fused tensor (`source_rows`) needs that tensor to have that many."""
    stored = [tuple(source.shape(name)) for name, _ in sources]
    rows = [math.prod(s[:-1]) for s in stored]
    picks = [order is not None and order.source_rows is not None for _, order in sources]
    fits = all(s[-1] == shape[-1] for s in stored) and all(
        r == order.source_rows
        for r, (_, order), pick in zip(rows, sources, picks, strict=True)
        if pick  # type: ignore[union-attr]
    )
    if not any(picks):
        fits = fits and sum(rows) == math.prod(shape[:-1])
    if not fits:
        what = ", ".join(dict.fromkeys(name for name, _ in sources))
        found = " + ".join(str(list(s)) for s in stored)
        raise CheckpointError(f"tensor {pname} ({what}): expected shape {list(shape)}, found {found}")


def gguf_blocks(
    cfg: ModelConfig,
    source: TensorSource,
    names: NameMap,
    pname: str,
    shape: tuple[int, ...],
    is_stacked: bool = False,
) -> QuantizedWeight | None:
    """The stored bytes of parameter `pname` [*, K] (its parts' rows concatenated: fused q|k|v or gate|up,
    or with `is_stacked` a 3-D expert stack [E, N, K] read as [E·N, K]) when every part is of one type
    kept as stored and needs no transform; else None. Q4_0 / Q4_1 rows are packed by the C kernel straight
    from where they lie in the file's map (`pack_rows`: fused parts and un-permuted q/k rows are never
    gathered first); Q8_0 (as q8_0g), K-quant, MXFP4 and F16 / BF16 rows are used as stored: rows in one
    run (parts stored back to back too) are a view of the map, Q8_0 / K-quant parts lying apart a
    MappedWeight — the kernels read them where they lie through a row table —, other moved rows (un-permuted
    q / k, F16, expert stacks) gathered by `gather_rows` (an OpenMP memcpy);
    fused parts of different kinds run as stored (Q4_K_M's Q4_K q|k beside a Q6_K v, Gemma 3's Q5_0 q|k
    beside a Q8_0 v) go through `load_raw` into one kmix weight."""
    load_raw = getattr(source, "load_raw", None)
    sources = row_sources(cfg, source, names, pname, shape, is_stacked)
    if load_raw is None or sources is None:
        return None
    num_rows, k = math.prod(shape[:-1]), shape[-1]
    _check_sizes(source, sources, pname, shape)
    found = row_addresses(source, sources, shape)
    kind = None if found is None else GGML_KINDS.get(found[0])
    kind = AS_STORED.get(kind, kind)  # type: ignore[arg-type]
    if found is not None and kind in BLOCK_BYTES:
        data = kernel_ops.kernels().pack_rows(kind, found[1], num_rows, k)  # type: ignore[union-attr]
        return QuantizedWeight(kind, data, num_rows, k)
    if found is not None and (kind in ROW_KINDS or kind in GGML_BLOCK_KINDS):  # K-quants, 16-bit, Q8_0, MXFP4
        step, rows = row_bytes(kind, k), found[1]
        n_runs = runs(rows, step)
        if kind in MAPPED_FROM_FILE and not is_stacked and 1 < n_runs <= MAX_MAPPED_RUNS:
            lo, hi = int(rows.min()), int(rows.max()) + step
            view = _mapped_view(source, lo, hi - lo)
            if view is not None:
                return MappedWeight(kind, rows, view, num_rows, k)
        return QuantizedWeight.from_ggml(found[0], _as_one(source, rows, step, n_runs), num_rows, k)
    raws = []
    for name, order in sources:
        ggml_type, raw = load_raw(name)
        raws.append((ggml_type, _reordered(raw, order)))
    types = {t for t, _ in raws}
    if len(types) > 1 and types <= _MIX_TYPES:  # fused parts in different kinds (Q4_K_M's, Gemma 3's q|k|v)
        parts = [
            QuantizedWeight.from_ggml(t, r, r.numel() // row_bytes(GGML_KINDS[t], k), k) for t, r in raws
        ]
        return QuantizedWeight.from_parts(parts)
    if len(types) != 1 or (ggml_type := types.pop()) not in _KEPT_TYPES:
        return None
    data = raws[0][1] if len(raws) == 1 else torch.cat([r.reshape(-1) for _, r in raws])
    return QuantizedWeight.from_ggml(ggml_type, data, num_rows, k)


def mxfp4_as_stored(
    cfg: ModelConfig, source: TensorSource, names: NameMap, pname: str, shape: tuple[int, ...]
) -> QuantizedWeight | None:
    """Parameter `pname` [*, N, K] made from an HF checkpoint's MXFP4 pair (`load_mxfp4`: blocks
    [*, N, G, 16], scales [*, N, G], rows the output features) as one mxfp4 weight [∏(*, N), K]: the blocks
    re-laid in GGUF's order (kernels/mxfp4.py `from_hf`, the one copy, at 4.25 bits a value), their rows
    moved as the name map moves the float tensor's — a `Reshaping` from the pair's float view [*, K, N]
    (loading/mxfp4.py) that transposes it and reorders whole rows (GPT-OSS's gate / up de-interleaved), here
    given the rows' bytes in the place of K. None without such a pair (the float path then dequantizes
    it)."""
    load_mxfp4 = getattr(source, "load_mxfp4", None)
    whole = names.source(pname)
    if load_mxfp4 is None or whole is None or not isinstance(whole[1], Reshaping | None):
        return None
    pair = load_mxfp4(whole[0])
    if pair is None:
        return None
    raw = mxfp4.from_hf(*pair)  # [*, N, G·17]
    if whole[1] is not None:
        raw = whole[1](raw.transpose(-1, -2))  # the float view's [*, K, N] with bytes for K
    num_rows, k = math.prod(shape[:-1]), shape[-1]
    if tuple(raw.shape) != (*shape[:-1], row_bytes(MXFP4, k)):
        return None
    return QuantizedWeight(MXFP4, raw.reshape(num_rows, -1).contiguous(), num_rows, k)


def quantized_in_place(
    loader: WeightLoader, pname: str, shape: tuple[int, ...], kind: str, is_stacked: bool = False
) -> QuantizedWeight | None:
    """Parameter `pname` [*, K] quantized to block kind `kind` by the C kernel straight from where its
    rows lie in the checkpoint's map (`quantize_rows`: f32 / bf16 / f16 rows, never read into a float
    tensor, fused parts never gathered), its tensors then consumed (their mapped pages dropped); None when
    the source, the stored types or the kernel library do not allow it."""
    if kind not in BLOCK_BYTES and kind != Q8_0G:
        return None
    sources = row_sources(loader.cfg, loader.source, loader.names, pname, shape, is_stacked)
    found = None if sources is None else row_addresses(loader.source, sources, shape)
    dtype = None if found is None else _FLOAT_TYPES.get(found[0])
    if dtype is None:
        return None
    num_rows, k = math.prod(shape[:-1]), shape[-1]
    lib = kernel_ops.kernels()
    data = lib.quantize_rows(kind, found[1], dtype, num_rows, k)  # type: ignore[union-attr, index]
    loader.consume(pname, shape, is_copied=True)
    return QuantizedWeight(kind, data, num_rows, k)


def bf16_as_stored(loader: WeightLoader, pname: str, shape: tuple[int, ...]) -> QuantizedWeight | None:
    """`--quantize bf16` on a parameter `pname` [N, K] whose checkpoint rows are stored bf16: those rows as
    they lie — one run of the file (a single tensor, or parts stored back to back: HF's gate_proj, up_proj)
    a view of the map, parts apart (q|k|v) a MappedWeight over the map (the kernels read them through a
    row table; gathering them was 0.2 s of a 0.45 s 1B load), rows out of order gathered by `gather_rows`
    —, never read into per-part tensors and
    concatenated (two copies of every fused weight: 4.5 s of a 1B load). None when the source has no map or
    a part is stored in another type."""
    source = loader.source
    span = getattr(source, "span", None)
    sources = row_sources(loader.cfg, source, loader.names, pname, shape, is_stacked=False)
    found = None if sources is None or span is None else row_addresses(source, sources, shape)
    if found is None or found[0] != "BF16":
        return None
    rows, (num_rows, k) = found[1], shape
    step = row_bytes("bf16", k)
    n_runs = runs(rows, step)
    view = None
    if 1 < n_runs <= MAX_MAPPED_RUNS:
        lo, hi = int(rows.min()), int(rows.max()) + step
        view = _mapped_view(source, lo, hi - lo)
    loader.consume(pname, shape, is_copied=n_runs > 1 and view is None)
    if view is not None:
        return MappedWeight("bf16", rows, view, num_rows, k)
    data = _as_one(source, rows, step, n_runs)
    return QuantizedWeight("bf16", data.view(torch.bfloat16).reshape(num_rows, k), num_rows, k)


def _mapped_view(source: TensorSource, address: int, num_bytes: int) -> torch.Tensor | None:
    """The map's view of `num_bytes` from `address`, or None where the rows lie in two files' maps: a fused
    weight whose parts a split GGUF or a sharded checkpoint keeps in different files (then gathered)."""
    try:
        return source.span(address, num_bytes)  # type: ignore[attr-defined]
    except ValueError:
        return None


def _as_one(source: TensorSource, rows: torch.Tensor, step: int, n_runs: int) -> torch.Tensor:
    """The rows at addresses `rows` (`step` bytes each, `n_runs` runs) as one uint8 tensor: a view of the
    map when they are one run of the file (also parts stored back to back, e.g. ffn_gate then ffn_up), else
    gathered by `gather_rows` (an OpenMP memcpy)."""
    if n_runs > 1:
        return kernel_ops.kernels().gather_rows(rows, step)  # type: ignore[union-attr]
    return source.span(int(rows[0]), rows.numel() * step)  # type: ignore[attr-defined]


def runs(rows: torch.Tensor, step: int) -> int:
    """How many runs of back-to-back rows (`step` bytes apart, in order) the row addresses `rows` form."""
    return 1 + int((rows.diff() != step).sum()) if rows.numel() else 0


def is_copy(source: TensorSource, data: torch.Tensor) -> bool:
    """Whether `data` was copied out of the checkpoint (repacked, fused, rows rearranged) rather than viewing
    its map in place: then nothing reads the mapped pages again and they can be dropped."""
    holds = getattr(source, "holds", None)
    return holds is None or not holds(data)
