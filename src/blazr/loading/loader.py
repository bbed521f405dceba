"""Build a model from a detected checkpoint: construct on the meta device, pull weights tensor by tensor
(safetensors via mmap, GGUF dequantized per tensor), move to the target device, then keep or make
quantized linear weights (loading/quantize.py) where the CPU kernels run them."""

from __future__ import annotations

import logging

import torch

from blazr import kernels
from blazr.detect import Checkpoint
from blazr.kernels import ops
from blazr.kernels.build import cpu_flags
from blazr.loading.gguf import GGUFFile, gguf_to_hf_name, unpermute_qk
from blazr.loading.names import name_map_for
from blazr.loading.quantize import check_mode, quantize_model, wrap_float_linears
from blazr.loading.safetensors import SafetensorsCheckpoint
from blazr.loading.weights import TensorSource, load_weights
from blazr.model.model import CausalLM

log = logging.getLogger("blazr.loading")


class GGUFSource:
    """A GGUF file seen through HF tensor names, q/k rows un-permuted back to the HF layout."""

    def __init__(self, gguf: GGUFFile, num_heads: int, num_kv_heads: int) -> None:
        self.gguf = gguf
        self.path = gguf.path
        self._by_hf = {hf: name for name in gguf.tensor_names if (hf := gguf_to_hf_name(name)) is not None}
        self._heads = {"q_proj": num_heads, "k_proj": num_kv_heads}

    @property
    def names(self) -> set[str]:
        return set(self._by_hf)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.gguf.tensor_shape(self._by_hf[name])

    def load(self, name: str) -> torch.Tensor:
        t = self.gguf.load(self._by_hf[name], torch.float32)
        proj = name.rsplit(".", 2)[-2]
        if proj in self._heads:
            t = unpermute_qk(t, self._heads[proj])
        return t

    def load_raw(self, name: str) -> tuple[str, torch.Tensor]:
        """(ggml type, stored bytes [rows, bytes per row]) of tensor `name`, q/k rows un-permuted."""
        gname = self._by_hf[name]
        raw = self.gguf.raw(gname)
        proj = name.rsplit(".", 2)[-2]
        if proj in self._heads:
            raw = unpermute_qk(raw, self._heads[proj])
        return self.gguf.tensor_type(gname), raw.contiguous()

    def file_of(self, name: str) -> object:
        return self.gguf.path


def open_source(ckpt: Checkpoint) -> TensorSource:
    if ckpt.format == "gguf":
        attn = next((layer.attention for layer in ckpt.config.layers if layer.attention), None)
        heads = (attn.num_heads, attn.num_kv_heads) if attn else (1, 1)
        return GGUFSource(ckpt.gguf or GGUFFile(ckpt.weight_files[0]), *heads)
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
