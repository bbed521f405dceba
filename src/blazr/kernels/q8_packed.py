"""A GGUF's Q8_0 linears re-laid at load in the row-packed layout (kind q8_0 instead of q8_0g) where host
tuning measures that layout's one-row decode faster — and when the loader takes it.

A GGUF's Q8_0 tensors run as the file stores them (q8_0g, csrc/linear_q8.c: tiles of 8 consecutive rows, each
block of the 8 read together — 8 interleaved runs of bytes). The row-packed layout (csrc/linear_q.c, the one
Q4_0 / Q4_1 GGUFs are packed into at load) holds the same values in groups of 16 rows, a group one run of
bytes, and linear_q8.c's header gives why the two compute the same bits: the same activation rounding, the
same exact integer block dots, the same fmas in the same order (its prefill already packs each 16-row group
as it goes and runs linear_q.c's group kernel). A one-row call walks up to 4 groups far apart at once
(host-tuned weight streams), which on a core whose reads grow with the runs in flight reads faster: Zen 3,
cold 1B shapes, 2 threads, packed Q8_0 in 4 streams 16.8-20.3 GB/s against the stored layout's 14-18
(benchmarks/NOTES.md §66). Elsewhere the stored layout may win (its 8-row tiles batch many sequences well),
so host tuning decides (kernels/tuning.py `q8pack_q8_0g`), and the stored layout stays where it did not
measure the packed one faster — so an untuned host loads what it loaded before.

Re-laid: whole linear weights of kind q8_0g on the CPU (a view of the file's map, a MappedWeight's rows
gathered first, or a copy), through the quantization cache like the K-quants' groups (loading/relaid.py), so
a later load maps the packed bytes. Kept as stored: the output head (tied or not: q8_0g has the fp32-x form
that `head_precision` chooses, csrc/linear_q8xf.c, the packed kind none), MoE expert stacks (not measured
re-laid: an expert's few rows a token), token tables, builds without AVX2 (the scalar build's packed kernel
is no faster), or with `BLAZR_Q8PACK=0` (`=1` packs wherever the build can: for A/B measurements and tests).
"""

from __future__ import annotations

from blazr.kernels import ops, tuning
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import Q8_0G, QuantizedWeight

PACKED = "q8_0"  # the row-packed kind (csrc/linear_q.c)


def wanted() -> bool:
    """Whether the loader re-lays a GGUF's Q8_0 linears on this host: never without the library's AVX2 path;
    else `BLAZR_Q8PACK` (0 / 1) when set, else host tuning's choice (`q8pack_q8_0g`: the stored layout unless
    the packed one read MARGIN faster here)."""
    lib = ops.kernels()
    if lib is None or "avx2" not in lib.features:
        return False
    return tuning.takes("BLAZR_Q8PACK", f"q8pack_{Q8_0G}", "packed", default="stored")


def packs(qw: QuantizedWeight, num_stacked: int = 1, head: bool = False) -> bool:
    """Whether the loader re-lays `qw`: a q8_0g linear weight (not an expert stack, not the output `head`) on
    the CPU, on a host that re-lays them (`wanted`)."""
    if qw.kind != Q8_0G or num_stacked != 1 or head:
        return False
    if not isinstance(qw, MappedWeight) and not qw.data.is_cpu:
        return False
    return wanted()


def runs_as() -> str:
    """The kind a GGUF's Q8_0 linear weight (not the head, not an expert stack) runs as on this host: q8_0
    (re-laid) or q8_0g (as stored)."""
    return PACKED if wanted() else Q8_0G


def pack(qw: QuantizedWeight) -> QuantizedWeight:
    """A q8_0g weight in the row-packed layout (kind q8_0): its ggml rows — a MappedWeight's gathered into
    fresh memory first, not kept — moved into groups of 16 rows (quant.py `pack_blocks`)."""
    if qw.kind != Q8_0G:
        raise ValueError(f"q8_packed.pack: a q8_0g weight expected, found {qw.kind}")
    rows = qw.gather() if isinstance(qw, MappedWeight) else qw.data
    return QuantizedWeight.from_blocks(PACKED, rows, qw.out_features, qw.in_features)
