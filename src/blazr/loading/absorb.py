"""MLA's absorbed decode weights, made once at load: each MLA layer's `kv_b_proj` [H·(Dn + Dv), Lkv] split
into the two per-head weights the decode kernels run (`MLA.absorbed`, model/mla.py) — W_UKᵀ [H·Lkv, Dn]
(q_lat = q_nope · W_UK per head) and W_UV [H·Dv, Lkv] — in a kernel weight format:

- `int8` / `int4` / `bf16`: the mode's kind (Q8_0 as q8_0g / Q4_1 / bf16), as every other linear under that
  mode; the rounded values are written back into `kv_b_proj`, so prefill (which reads `kv_b_proj`) and
  decode compute with the same weights;
- `auto`: the smallest kind that holds the weights exactly — Q8_0 as q8_0g (a Q8_0 GGUF's attn_k_b /
  attn_v_b: their blocks run along Dn and Lkv, as these rows do), f16, bf16 — else f32: no value changes;
- `none`: f32.
A 32-block kind needs Dn and Lkv multiples of 32 (Q4_1, row-packed, also whole 16-row groups per head);
otherwise the next kind.

Shapes: H heads, Dn / Dv head dims, Lkv the latent rank.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from blazr.kernels.quant import BLOCK_BYTES, Q8_0G, QK, ROW_GROUP, QuantizedWeight, dequantize, quantize
from blazr.model.mla import MLA

_MODE_KIND = {"int8": "q8_0g", "int4": "q4_1", "bf16": "bf16", "none": "f32"}
_ROUNDING_MODES = ("int8", "int4", "bf16")
_EXACT_KINDS = ("q8_0g", "f16", "bf16")  # `auto`'s tries, smallest first


def _fits(kind: str, weight: torch.Tensor, heads: int) -> bool:
    """Whether `kind` can hold weight [H·N, K] split per head: a 32-block kind needs K in blocks of 32, a
    row-packed one also whole 16-row groups per head."""
    if kind == Q8_0G:
        return weight.shape[1] % QK == 0
    if kind not in BLOCK_BYTES:
        return True
    return weight.shape[1] % QK == 0 and (weight.shape[0] // heads) % ROW_GROUP == 0


def _made(weights: tuple[torch.Tensor, torch.Tensor], heads: int, mode: str) -> list[QuantizedWeight]:
    """The pair in the kind `mode` picks (f32 where that kind cannot hold them); under `auto` the first of
    `_EXACT_KINDS` whose dequantized values equal the weights, else f32."""
    if mode in _MODE_KIND:
        kind = _MODE_KIND[mode]
        return [quantize(w, kind if all(_fits(kind, v, heads) for v in weights) else "f32") for w in weights]
    for kind in _EXACT_KINDS:
        if all(_fits(kind, w, heads) for w in weights):
            made = [quantize(w, kind) for w in weights]
            if all(torch.equal(dequantize(q), w) for q, w in zip(made, weights, strict=True)):
                return made
    return [quantize(w, "f32") for w in weights]


def absorb_mla(model: torch.nn.Module, mode: str) -> Counter[str]:
    """Set `absorbed` on every MLA layer of `model` (float32 CPU weights) for `mode` (loading/quantize.py's
    modes); returns how many layers of each kind were made."""
    made: Counter[str] = Counter()
    for module in model.modules():
        if not isinstance(module, MLA):
            continue
        cfg, w = module.cfg, module.kv_b_proj.weight.detach()
        H, Dn, Dv, L = cfg.num_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        per_head = w.view(H, Dn + Dv, L)
        w_uk_t = per_head[:, :Dn].transpose(1, 2).reshape(H * L, Dn)  # copies: rows along Dn
        w_uv = per_head[:, Dn:].reshape(H * Dv, L)  # (rows along L)
        q_uk, q_uv = _made((w_uk_t, w_uv), H, mode)
        kind = q_uk.kind
        if kind != "f32" and mode in _ROUNDING_MODES:  # prefill computes with the rounded values too (a new
            rounded = torch.cat(  # tensor: the loaded one may be a read-only view of the file)
                (dequantize(q_uk).view(H, L, Dn).transpose(1, 2), dequantize(q_uv).view(H, Dv, L)), dim=1
            )
            module.kv_b_proj.weight = nn.Parameter(rounded.reshape(w.shape), requires_grad=False)
        module.absorbed = (q_uk, q_uv)
        made[kind] += 1
    return made
