"""blazr's CPU kernel library: fused C kernels (block-quantized / bf16 / fp32 linear with bias, residual and
SwiGLU epilogues; RMSNorm and Mamba2's gated norm; NeoX RoPE; KV-cache write; paged decode attention; the
Mamba2 decode step and prefill scan; embedding, scaled add, activations) called through ctypes, each with a
plain torch reference beside it, and `record()` to replay a recorded sequence of kernel calls (a whole
decode step) with one C call.

`build.py` compiles `csrc/*.c` for the host (cached, `BLAZR_KERNELS=0` disables it); `quant.py` holds the
weight formats (ggml block layouts); `bindings.py` (+ `bindings_mamba2.py`) the ctypes bindings,
`calls.py` how a call's arguments travel and the recorded `KernelPlan`, `reference*.py` the torch
references and `ops.py` the dispatch between them (the one import point; `dispatch.py` holds the
library state, `ops_recurrent.py` / `ops_moe_mla.py` the op families it re-exports); `capture.py` records
a torch function made of kernel calls (the model's decode step) as a plan. Model code calls the functions
re-exported here; they fall back to the references when the library is unavailable.

The re-exports are resolved lazily (PEP 562), so `python -m blazr.kernels.build` runs without the package
having imported its own submodule first.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "available": "blazr.kernels.build",
    "KernelPlan": "blazr.kernels.ops",
    "kv_write": "blazr.kernels.ops",
    "linear": "blazr.kernels.ops",
    "record": "blazr.kernels.ops",
    "paged_attention_decode": "blazr.kernels.ops",
    "rms_norm": "blazr.kernels.ops",
    "rope_neox": "blazr.kernels.ops",
    "QuantizedWeight": "blazr.kernels.quant",
    "dequantize": "blazr.kernels.quant",
    "quantize": "blazr.kernels.quant",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'blazr.kernels' has no attribute {name!r}")
