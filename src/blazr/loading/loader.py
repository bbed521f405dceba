"""Build a model from a detected checkpoint: construct on the meta device, pull weights tensor by tensor
(safetensors via mmap, GGUF through its HF view: loading/gguf_hf.py), move to the target device, then keep
or make quantized linear weights (loading/quantize.py) where the CPU kernels run them."""

from __future__ import annotations

import logging

import torch

from blazr import kernels
from blazr.detect import Checkpoint
from blazr.kernels import ops
from blazr.kernels.build import cpu_flags
from blazr.loading.gguf import GGUFFile
from blazr.loading.gguf_hf import GGUFView
from blazr.loading.names import name_map_for
from blazr.loading.quantize import check_mode, quantize_model, wrap_float_linears
from blazr.loading.safetensors import SafetensorsCheckpoint
from blazr.loading.weights import TensorSource, load_weights
from blazr.model.model import CausalLM

log = logging.getLogger("blazr.loading")


def open_source(ckpt: Checkpoint) -> TensorSource:
    if ckpt.format == "gguf":
        layers = ckpt.config.layers
        q_heads = [layer.attention.num_heads if layer.attention else 0 for layer in layers]
        kv_heads = [layer.attention.num_kv_heads if layer.attention else 0 for layer in layers]
        return GGUFView(ckpt.gguf or GGUFFile(ckpt.weight_files[0]), q_heads, kv_heads)
    return SafetensorsCheckpoint(list(ckpt.weight_files))


def load_model(
    ckpt: Checkpoint,
    device: torch.device,
    dtype: torch.dtype,
    max_len: int | None = None,
    show_progress: bool = False,
    quantize: str = "auto",
) -> CausalLM:
    """Load `ckpt` for `device` / `dtype`. `quantize` ("auto" | "none" | "int8" | "int4", see
    loading/quantize.py) applies on the CPU with float32 activations; elsewhere "auto" means "none"."""
    check_mode(quantize, device, dtype)
    with torch.device("meta"):
        model = CausalLM(ckpt.config, max_len)
    source = open_source(ckpt)
    names = name_map_for(ckpt.format, ckpt.config)
    load_weights(model, ckpt.config, source, names, dtype, device, show_progress)
    model = model.to(device).eval()
    if device.type == "cpu" and dtype == torch.float32 and kernels.available():
        made = quantize_model(model, source, names, quantize, dense_dtype=prefill_dtype())
        if made:
            log.info("quantized linear layers (%s): %s", quantize, dict(made))
        if wrapped := wrap_float_linears(model):
            log.info("float32 linear layers on the f32 decode kernel: %d", wrapped)
    return model


def prefill_dtype() -> torch.dtype | None:
    """The dtype of quantized layers' dense copies for prefill GEMMs, or None for none (prefill then runs
    the same int8 kernels as decode). Measured (benchmarks/NOTES.md): where the kernels have AVX512-VNNI
    they prefill faster than oneDNN's bf16 GEMM on a dense copy (Zen 4: 820-920 vs 660-760 tok/s on
    SmolLM2) with no second copy of the weights; AMX's bf16 tiles beat both, so AMX CPUs keep a bf16 copy;
    without VNNI a bf16 (AVX512-BF16) or float32 copy beats the scalar kernels."""
    flags = set(cpu_flags().split())
    if "amx_bf16" in flags:
        return torch.bfloat16
    lib = ops.kernels()
    if lib is not None and "avx512_vnni" in lib.features:
        return None
    return torch.bfloat16 if "avx512_bf16" in flags else torch.float32
