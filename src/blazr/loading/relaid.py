"""Weights re-laid at load into the form this host's kernels run fastest — a GGUF's K-quants in 16-row groups
(kernels/kquant_packed.py) and its Q8_0 in the row-packed layout (kernels/q8_packed.py), bf16 / f32 weights
with their top byte coded (kernels/coded.py) — each taken from the quantization cache (loading/quant_cache.py)
where an earlier load made it in the layout chosen now, else made here and handed to the cache under its
entry. Any other weight is returned as it is. The loader's modes call these (loading/quantize.py): `relaid`
for a GGUF's tensors kept as stored, `coded` for a float weight made or kept at load, `coded_or_narrowed` for
a float32 one (its values, bf16 where bf16 holds them all).
"""

from __future__ import annotations

from collections.abc import Callable

from blazr.kernels import coded as coded_kinds
from blazr.kernels import kquant_packed, q8_packed
from blazr.kernels.quant import QuantizedWeight
from blazr.loading.quant_cache import QuantCache


def relaid(
    cache: QuantCache | None, entry: str, qw: QuantizedWeight, num_stacked: int = 1, head: bool = False
) -> QuantizedWeight:
    """A GGUF's weight `qw` as the CPU kernels run it: a Q8_0 linear in the row-packed layout where this host
    runs that faster (kernels/q8_packed.py; not the output `head`, whose fp32-x form is the stored kind's); a
    K-quant whose kind this host packs re-laid in 16-row groups (kernels/kquant_packed.py `packed_kind`; the
    cache's copy only when it holds the layout chosen now — a kmix's segments follow host tuning, which may
    have changed its mind since; the 8B Q4_K_M's 4.2 GB took 1.8-3.3 s to re-lay, benchmarks/NOTES.md §57); a
    BF16 weight coded, an F16 one whose values bf16 holds too (`coded`); any other as it is."""
    if q8_packed.packs(qw, num_stacked, head):
        made = _through_cache(cache, entry, q8_packed.PACKED, qw, q8_packed.pack)
        assert made is not None  # packing always succeeds
        return made
    kind = kquant_packed.packed_kind(qw, num_stacked)
    if kind is None:
        return coded(cache, entry, qw)
    want = kquant_packed.layout(qw, num_stacked)
    made = _through_cache(
        cache, entry, kind, qw, kquant_packed.pack, lambda c: tuple(p.kind for p in c.parts()) == want
    )
    assert made is not None  # packing always succeeds
    return made


def cached_coded(
    cache: QuantCache | None, entry: str, shape: tuple[int, ...], kind: str
) -> QuantizedWeight | None:
    """The cache's coded copy of weight `entry` [N, K] of `kind` where this host codes it (so neither the
    checkpoint's rows nor a bf16 copy need be read), else None."""
    n, k = shape
    if cache is None or not coded_kinds.wanted(kind, k):
        return None
    return cache.get(entry, coded_kinds.KIND_OF[kind], n, k)


def coded(cache: QuantCache | None, entry: str, qw: QuantizedWeight) -> QuantizedWeight:
    """A bf16 / f32 weight with its top byte coded where this host's kernels decode it (kernels/coded.py:
    every bit kept, 0.77× / 0.88× the bytes a decode step reads), an f16 or f32 one as bf16z where bf16 holds
    its values (`coded.choices`, best first); any other weight, or one with rows of too many rare top bytes,
    as it is. The cache is asked for the best kind only: a copy in another (an f32z one that an earlier
    version made of bf16 values) is made again in the best; a weight whose row 0 alone bf16 holds is coded
    f32z at each load."""
    kinds = coded_kinds.choices(qw)
    if not kinds:
        return qw
    made = _through_cache(cache, entry, kinds[0], qw, lambda w: coded_kinds.pack(w, kinds))
    return qw if made is None else made


def coded_or_narrowed(cache: QuantCache | None, entry: str, qw: QuantizedWeight) -> QuantizedWeight:
    """`coded`, and an f32 weight that it leaves as it is stored as bf16 where bf16 holds every value
    (kernels/coded.py `as_bf16`: an F32 GGUF of a bf16 checkpoint) — the same values in half the bytes a
    decode step reads, where this host does not code them (no vector decode, host tuning's choice,
    `BLAZR_CODED=0`, rows too short to gain)."""
    made = coded(cache, entry, qw)
    held = coded_kinds.as_bf16(made) if made.kind == "f32" else None
    return made if held is None else held


def _through_cache(
    cache: QuantCache | None,
    entry: str,
    kind: str,
    qw: QuantizedWeight,
    make: Callable[[QuantizedWeight], QuantizedWeight | None],
    fits: Callable[[QuantizedWeight], bool] = lambda cached: True,
) -> QuantizedWeight | None:
    """`entry` in `kind` from the cache when it holds it (and `fits`), else `make(qw)` handed to the cache
    (None: `make` could not)."""
    cached = None if cache is None else cache.get(entry, kind, qw.out_features, qw.in_features)
    if cached is not None and fits(cached):
        return cached
    made = make(qw)
    if made is not None and cache is not None:
        cache.put(entry, made)
    return made
