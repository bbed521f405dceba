"""A GGUF file seen as the HuggingFace checkpoint llama.cpp's converter made it from.

Owns, per llama.cpp architecture (`general.architecture`), which GGUF tensors make each HF tensor and how:
the inverse of `convert_hf_to_gguf.py`. Names (`blk.N.ssm_in.weight` → `backbone.layers.N.mixer.in_proj.
weight`), q/k rows un-permuted (llama.cpp's interleaved rotary pairs → HF's halves), `A = -exp(A_log)` back
to A_log, Mamba's `[H, 1]` / `[G, Di/G]` / `[C, K]` reshapes undone, (1 + w) norms stored as 1 + w back to w
(Qwen3-Next / Qwen3.5, Gemma 2 / 3; Gemma 4's are plain), split tensors joined (gate | up rows, Granite's
experts, DeepSeek's per-head k_b / v_b into kv_b_proj) and stacked experts sliced per expert.
With that, detection runs the HF builders and loading the HF name maps unchanged, and quantized linear
weights pass through as stored bytes (`load_raw`: only row-wise ops, so ggml blocks stay whole).

The per-architecture name tables live beside this: the ops, rule and `Arch` shapes and the shared rules in
loading/gguf_hf_rules.py, the attention-only families' tables in loading/gguf_hf_attention.py, the
state-space / hybrid families' in loading/gguf_hf_hybrid.py. Here: `ARCHES`, their union, and `GGUFView`,
which applies an architecture's rules to a file's tensors and carries out the ops.

In: a `GGUFFile` and per-layer head counts. Out: `GGUFView` (HF names, shapes, float32 tensors, stored
bytes or row addresses for the quantized paths), or `UnsupportedError` for an architecture no table names.

Multipliers the converter folds into weights (Falcon-H1's µP) stay folded: detection then sets them to 1.

Shape letters: E experts, H heads, L latent (kv_lora_rank), Dn / Dv MLA nope / value head dims, C channels,
K conv kernel, G groups, R rows, Q block bytes.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from blazr.errors import CheckpointError, UnsupportedError
from blazr.loading import gguf_hf_attention, gguf_hf_hybrid
from blazr.loading.gguf import GGUFFile, dequantize, unpermute_qk
from blazr.loading.gguf_hf_rules import (
    A_LOG,
    CAT,
    CAT_EXPERTS,
    CONV,
    EXPERT,
    FLAT,
    INTERLEAVE,
    KV_B,
    OFFSET,
    QK,
    ROW,
    SAME,
    Arch,
)

log = logging.getLogger("blazr.loading")

_ROWWISE = (SAME, QK, CAT, EXPERT, CAT_EXPERTS)  # ops whose stored bytes are whole rows: blocks pass through


@dataclass(frozen=True)
class Recipe:
    """One HF tensor: its GGUF sources, its HF shape, and the op that joins them."""

    sources: tuple[str, ...]
    shape: tuple[int, ...]
    op: str = SAME
    arg: int = 0


# llama.cpp architecture → which GGUF tensors make each HF tensor
ARCHES: dict[str, Arch] = {**gguf_hf_attention.ARCHES, **gguf_hf_hybrid.ARCHES}
# the output norm is a (1 + w) norm stored as 1 + w
_GLOBAL_OFFSET = gguf_hf_attention.OUTPUT_NORM_OFFSET | gguf_hf_hybrid.OUTPUT_NORM_OFFSET
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
# llama.cpp's rope factors (llama3's precomputed, LongRoPE's short / long): detection reads them as config
_IGNORED = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")


def supported_architectures() -> list[str]:
    return sorted(ARCHES)


class GGUFView:
    """The tensors of `gguf` under the HF names and shapes its converter read them from.

    `q_heads` / `kv_heads`: per layer, the attention heads of the layers whose q/k rows were permuted (0 for
    layers without attention); other layers and architectures ignore them.
    """

    def __init__(self, gguf: GGUFFile, q_heads: Sequence[int] = (), kv_heads: Sequence[int] = ()) -> None:
        arch_name = gguf.metadata.get("general.architecture")
        arch = ARCHES.get(str(arch_name))
        if arch is None:
            raise UnsupportedError(
                f"{gguf.path}: GGUF architecture {arch_name!r} is not supported "
                f"(supported: {', '.join(supported_architectures())})"
            )
        self.gguf = gguf
        self.path = gguf.path
        self.hf_architecture = arch.hf_architecture
        self._recipes: dict[str, Recipe] = {}
        used: set[str] = set()
        for name, hf in arch.globals.items():
            if f"{name}.weight" in gguf.tensor_names:
                op = OFFSET if name == "output_norm" and arch_name in _GLOBAL_OFFSET else SAME
                self._recipes[hf] = Recipe((f"{name}.weight",), gguf.tensor_shape(f"{name}.weight"), op)
                used.add(f"{name}.weight")
        by_layer: dict[int, set[str]] = {}
        for name in gguf.tensor_names:
            if m := _BLOCK.fullmatch(name):
                by_layer.setdefault(int(m.group(1)), set()).add(m.group(2))
        modules = {k: arch.modules.get(k, "") for k in "amf"}
        for i, tails in sorted(by_layer.items()):
            prefix = arch.layer.format(i=i)
            for hf_tail, gguf_tails, op in arch.rules:
                hf = prefix + hf_tail.format(**modules)
                if hf in self._recipes or not all(t in tails for t in gguf_tails):
                    continue
                sources = tuple(f"blk.{i}.{t}" for t in gguf_tails)
                heads = 0
                if op == QK:
                    heads = _at(q_heads if ".q_proj." in hf else kv_heads, i)
                    if not arch.permuted or heads == 0:
                        op = SAME
                self._recipes[hf] = self._recipe(sources, op, heads)
                used.update(sources)
            for hf_tail, gguf_tail in arch.experts:
                if gguf_tail not in tails:
                    continue
                src = f"blk.{i}.{gguf_tail}"
                E, R, C = self._shape3(src)
                for e in range(E):
                    self._recipes[prefix + hf_tail.format(e=e)] = Recipe((src,), (R, C), EXPERT, e)
                used.add(src)
        left = sorted(n for n in gguf.tensor_names if n not in used and not n.endswith(_IGNORED))
        if left:
            more = f" (+{len(left) - 5} more)" if len(left) > 5 else ""
            log.warning(
                "%s: %d GGUF tensors have no HF name and are ignored: %s%s",
                gguf.path,
                len(left),
                left[:5],
                more,
            )

    def _shape3(self, name: str) -> tuple[int, int, int]:
        shape = self.gguf.tensor_shape(name)
        if len(shape) != 3:
            raise CheckpointError(
                f"{self.path}: tensor {name!r}: expected 3 dims [E, R, C], found {list(shape)}"
            )
        return shape[0], shape[1], shape[2]

    def _recipe(self, sources: tuple[str, ...], op: str, heads: int) -> Recipe:
        shapes = [self.gguf.tensor_shape(s) for s in sources]
        first = shapes[0]
        if op == A_LOG and len(first) == 2 and first[1] > 1:  # Mamba1's A [Di, N]: as stored
            return Recipe(sources, first, op)
        if op in (A_LOG, FLAT):
            return Recipe(sources, (math.prod(first),), op)
        if op == ROW:
            return Recipe(sources, (1, math.prod(first)), op)
        if op == CONV:  # [C, K] (or Kimi-Linear's [1, C, 1, K]) → [C, 1, K]
            return Recipe(sources, (math.prod(first[:-1]), 1, first[-1]), op)
        if op == CAT:
            return Recipe(sources, (sum(s[0] for s in shapes), *first[1:]), op)
        if op == INTERLEAVE:
            return Recipe(sources, (first[0], 2 * first[1]), op)
        if op == CAT_EXPERTS:
            (E, R, C), (_, R2, _) = self._shape3(sources[0]), self._shape3(sources[1])
            return Recipe(sources, (E, R + R2, C), op)
        if op == KV_B:
            (H, L, Dn), (_, Dv, _) = self._shape3(sources[0]), self._shape3(sources[1])
            return Recipe(sources, (H * (Dn + Dv), L), op)
        return Recipe(sources, first, op, heads)

    @property
    def names(self) -> set[str]:
        return set(self._recipes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._recipes[name].shape

    def sources(self, name: str) -> tuple[str, ...]:
        """The GGUF tensors HF tensor `name` is made from."""
        return self._recipes[name].sources

    def file_of(self, name: str) -> object:
        return f"{self.path} ({', '.join(self._recipes[name].sources)})"

    def _expert_rows(self, r: Recipe) -> torch.Tensor:
        """The stored bytes of expert `r.arg`: its R rows of the stacked [E·R, bytes per row]."""
        return self._arrange_rows(r, [self.gguf.raw(r.sources[0])])

    def load(self, name: str) -> torch.Tensor:
        """HF tensor `name` as float32, in HF layout (an expert dequantizes only its own rows)."""
        r = self._recipes[name]
        if r.op == EXPERT:
            return dequantize(self._expert_rows(r), self.gguf.tensor_type(r.sources[0]), r.shape)
        ts = [self.gguf.load(s, torch.float32) for s in r.sources]
        if r.op == SAME:
            return ts[0]
        if r.op == QK:
            return unpermute_qk(ts[0], r.arg)
        if r.op == A_LOG:
            return torch.log(-ts[0]).reshape(r.shape)
        if r.op == OFFSET:
            return ts[0] - 1
        if r.op in (FLAT, CONV, ROW):
            return ts[0].reshape(r.shape)
        if r.op == CAT:
            return torch.cat(ts)
        if r.op == INTERLEAVE:
            return torch.stack(ts, dim=-1).flatten(-2)
        if r.op == CAT_EXPERTS:
            return torch.cat(ts, dim=1)
        k_b, v_b = ts  # KV_B: [H, L, Dn], [H, Dv, L] → per head [Dn + Dv, L]
        return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(r.shape)

    def release(self, name: str) -> None:
        """Drop the mapped pages of HF tensor `name`'s sources (`GGUFFile.release`): call only once its bytes
        were copied (dequantized or repacked) and no view of them is kept."""
        for src in self._recipes[name].sources:
            self.gguf.release(src)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether tensor `t` views the file's map (`GGUFFile.holds`)."""
        return self.gguf.holds(t)

    def span(self, address: int, num_bytes: int) -> torch.Tensor:
        """A view of the file's map (`GGUFFile.span`)."""
        return self.gguf.span(address, num_bytes)

    def load_raw(self, name: str) -> tuple[str, torch.Tensor]:
        """(ggml type, stored bytes [rows, bytes per row]) of HF tensor `name` when it is whole rows of GGUF
        tensors of one type (q/k rows un-permuted); else ("F32", its float32 bytes), which no quantized path
        takes as blocks."""
        r = self._recipes[name]
        types = {self.gguf.tensor_type(s) for s in r.sources}
        if r.op not in _ROWWISE or len(types) != 1:
            t = self.load(name)
            return "F32", t.reshape(-1, t.shape[-1]).view(torch.uint8)
        raw = self._arrange_rows(r, [self.gguf.raw(s) for s in r.sources])
        return types.pop(), raw.contiguous()  # one tensor's rows in order: a view of the file, no copy

    def row_addresses(self, name: str) -> tuple[str, torch.Tensor] | None:
        """(ggml type, int64 [rows]: the address of each row's stored bytes in the file's map, in HF row
        order) — `load_raw`'s rows without gathering them (for `pack_rows`) — when HF tensor `name` is whole
        rows of GGUF tensors of one type; else None. The map lives as long as this view."""
        r = self._recipes[name]
        types = {self.gguf.tensor_type(s) for s in r.sources}
        if r.op not in _ROWWISE or len(types) != 1:
            return None
        parts = []
        for s in r.sources:
            raw = self.gguf.raw(s)  # [R, bytes per row], contiguous
            parts.append((raw.data_ptr() + torch.arange(raw.shape[0]) * raw.stride(0)).unsqueeze(1))
        return types.pop(), self._arrange_rows(r, parts).reshape(-1)

    def _arrange_rows(self, r: Recipe, parts: list[torch.Tensor]) -> torch.Tensor:
        """The rows of a row-wise recipe from its sources' rows `parts` (each [R, X]: stored bytes, or row
        addresses as [R, 1])."""
        if r.op == EXPERT:  # expert `arg`: its R rows of the stacked [E·R, X]
            R = r.shape[0]
            return parts[0][r.arg * R : (r.arg + 1) * R]
        if r.op == QK:
            return unpermute_qk(parts[0], r.arg)
        if r.op == CAT_EXPERTS:  # per expert its gate rows, then its up rows
            E = r.shape[0]
            rows = [t.reshape(E, -1, t.shape[-1]) for t in parts]
            return torch.cat(rows, dim=1).reshape(-1, parts[0].shape[-1])
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _at(values: Sequence[int], i: int) -> int:
    return int(values[i]) if i < len(values) else 0
