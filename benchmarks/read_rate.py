"""A decode step as a read rate: the weight bytes one token reads from a GGUF — its header's tensors, less the
token embedding where the output head stands apart (a step reads one row of it; tied, the embedding is the
head and is read whole), a MoE's routed experts (`*_exps`) at the share a token uses (expert_used_count of
expert_count: one sequence's expected bytes), shared experts whole. Bytes × decode tok/s is the rate a step
streams its weights at: where two engines both run near the host's read rate, a step is bandwidth-bound and
no kernel moves it. The tables of realsize.py and hybrid_peers.py print it beside each engine's decode."""

from __future__ import annotations

import math
import mmap
from pathlib import Path

from blazr.loading.gguf_header import GGML_TYPES, parse_header


def decode_bytes(gguf: Path) -> int:
    """Weight bytes one decode token of one sequence reads from `gguf` (see the module docstring)."""
    with open(gguf, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        header = parse_header(buf)
    arch = header.metadata.get("general.architecture", "")
    experts = header.metadata.get(f"{arch}.expert_count", 0)
    used = header.metadata.get(f"{arch}.expert_used_count", experts)
    size: dict[str, float] = {}
    for t in header.tensors:
        _, block, block_bytes = GGML_TYPES[t.ggml_type]
        size[t.name] = math.prod(t.dims) // block * block_bytes
        if "_exps." in t.name and experts:
            size[t.name] *= used / experts
    if "output.weight" in size:
        size.pop("token_embd.weight", None)
    return round(sum(size.values()))
