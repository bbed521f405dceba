"""Build a model from a detected checkpoint, each weight going from the file to its final layout once.

The model is constructed on the meta device (no memory, no random init). On the CPU with float32 activations
and the C kernels (`on_kernels`), the target linears of loading/quantize.py are made first, straight from
the file: a GGUF's quantized and 16-bit tensors as stored (`auto`: Q4_0 / Q4_1 / Q8_0 bytes repacked for the
kernels, K-quants and F16 / BF16 used in place — and the token table kept as stored, looked up row by row —,
never dequantized), or a float checkpoint's weights quantized one tensor at a time (`int8` / `int4` /
`bf16`: only that tensor is ever float; or, on a later load, mapped from the quantization cache that the
first load wrote, loading/quant_cache.py). Every parameter still on meta is then read in the compute dtype
(loading/weights.py: safetensors through `pread`, or as a view of the file's copy-on-write map when the
stored dtype already is the compute dtype; GGUF tensors dequantized from `pread` bytes). Mapped pages that
were only copied from are dropped (`release`), so peak memory stays near the weights' final size. Last, the
float32 linears left are put on the f32 kernel as they are, and each MLA layer gets its per-head decode
weights made from kv_b_proj (loading/absorb.py).

In: a `Checkpoint` (detect/). Out: a `CausalLM` on `device`, in eval mode.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import TYPE_CHECKING

import torch

from blazr import kernels, progress
from blazr.config import AttentionConfig
from blazr.detect import Checkpoint
from blazr.distributed.shard import shard_config, slice_tensor
from blazr.errors import UnsupportedError
from blazr.kernels.mapped import MappedWeight
from blazr.loading.absorb import absorb_mla
from blazr.loading.gguf_hf import GGUFView
from blazr.loading.gguf_split import open_gguf
from blazr.loading.names import name_map_for
from blazr.loading.quant_cache import QuantCache
from blazr.loading.quantize import (
    check_mode,
    code_float_experts,
    quantize_from_file,
    quantize_loaded,
    stack_experts,
    wrap_float_linears,
)
from blazr.loading.safetensors import SafetensorsCheckpoint
from blazr.loading.tables import embed_from_file, embed_quantized, per_layer_table, table_from_loaded
from blazr.loading.weights import TensorSource, WeightLoader, load_weights, set_parameter, with_offset
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.model import CausalLM
from blazr.model.qlinear import QuantizedLinear
from blazr.model.skeleton import skeleton

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup

log = logging.getLogger("blazr.loading")


def open_source(ckpt: Checkpoint) -> TensorSource:
    if ckpt.format == "gguf":
        attention = [layer.mixer(AttentionConfig) for layer in ckpt.config.layers]
        q_heads = [a.num_heads if a else 0 for a in attention]
        kv_heads = [a.num_kv_heads if a else 0 for a in attention]
        gguf = ckpt.gguf or open_gguf(ckpt.weight_files[0])
        gguf.prefetch()
        return GGUFView(gguf, q_heads, kv_heads)
    return SafetensorsCheckpoint(list(ckpt.weight_files), ckpt.name_prefix)


def load_model(
    ckpt: Checkpoint,
    device: torch.device,
    dtype: torch.dtype,
    max_len: int | None = None,
    show_progress: bool | None = None,
    quantize: str = "auto",
    tp: TPGroup | None = None,
) -> CausalLM:
    """Load `ckpt` for `device` / `dtype`. `quantize` ("auto" | "none" | "int8" | "int4" | "bf16", see
    loading/quantize.py) applies on the CPU with float32 activations; elsewhere "auto" means "none".
    `show_progress`: a progress bar on stderr (None: blazr.progress's policy — a terminal, no quiet asked).
    `tp`: load this rank's tensor-parallel shard (`load_shard`)."""
    if tp is not None and tp.world > 1:
        return load_shard(ckpt, device, dtype, max_len, quantize, tp)
    check_mode(quantize, device, dtype)
    t0 = time.perf_counter()
    model = skeleton(ckpt.config, max_len)
    source = open_source(ckpt)
    names = name_map_for(ckpt.format, ckpt.config, source.names)
    on_kernels = device.type == "cpu" and dtype == torch.float32 and kernels.available()
    num_params = len(list(model.parameters()))
    bar = progress.bar(num_params, f"loading {ckpt.name}", "tensor", show=show_progress)
    # the weights made at load: quantized in situ (ISQ modes), a GGUF's K-quants re-laid in groups (auto)
    cache = QuantCache.open(ckpt.weight_files, quantize) if on_kernels and quantize != "none" else None
    with bar:
        loader = WeightLoader(ckpt.config, source, names, dtype, device, bar, cache)
        made: Counter[str] = Counter()
        dense_dtype = prefill_dtype() if on_kernels else None
        if on_kernels:
            if kind := embed_quantized(model, loader, quantize):  # before a tied head is made from it
                made[f"{kind} embedding"] += 1
            made += quantize_from_file(model, loader, quantize, dense_dtype)
            made += stack_experts(model, loader, quantize)
            if quantize == "auto" and (kind := embed_from_file(model, loader)):
                made[f"{kind} embedding"] += 1
            if kind := per_layer_table(model, loader, quantize):
                made[f"{kind} per-layer table"] += 1
        load_weights(model, loader)
    loader.warn_unused()
    model = model.to(device).eval()
    if made:
        log.info("quantized linear layers (%s): %s", quantize, dict(made))
    if on_kernels and (wrapped := wrap_float_linears(model, quantize, cache)):
        log.info("float32 linear layers on the f32 decode kernel: %d", wrapped)
    if on_kernels and quantize == "auto" and (stacks := code_float_experts(model, cache)):
        log.info("float32 MoE experts coded (f32z): %d layers", stacks)
    if cache is not None and cache.hits:
        log.info("quantization cache: %d weights mapped from %s", cache.hits, cache.path)
    if cache is not None:
        cache.save()  # a background write when this load quantized anything the file did not hold
    if on_kernels and (absorbed := absorb_mla(model, quantize)):
        log.info("MLA per-head decode weights (W_UKᵀ, W_UV): %s", dict(absorbed))
    log.info("weights: %.2f GiB in %.1fs", weight_bytes(model) / 2**30, time.perf_counter() - t0)
    return model


def load_shard(
    ckpt: Checkpoint,
    device: torch.device,
    dtype: torch.dtype,
    max_len: int | None,
    quantize: str,
    tp: TPGroup,
) -> CausalLM:
    """Rank `tp.rank`'s shard (distributed/shard.py): the model of the per-rank config, each parameter read
    whole from the checkpoint (a view of the file's map where it can be) and cut to the rank's piece. On the
    CPU kernels (float32 activations) `--quantize int8 / int4 / bf16` then quantizes the shard's linears in
    memory, and the float ones left are put on the f32 decode kernel, as `load_model` does; a GGUF's
    quantized tensors are read as float (`auto` does not keep them: a block's rows would be cut)."""
    check_mode(quantize, device, dtype)
    t0 = time.perf_counter()
    model = skeleton(shard_config(ckpt.config, tp.world), max_len, tp)
    whole = skeleton(ckpt.config, max_len)
    shapes = {n: tuple(p.shape) for n, p in whole.named_parameters(remove_duplicate=True)}
    source = open_source(ckpt)
    loader = WeightLoader(
        ckpt.config, source, name_map_for(ckpt.format, ckpt.config, source.names), dtype, device
    )
    for pname, param in list(model.named_parameters(remove_duplicate=True)):
        if not param.is_meta:
            continue
        want = torch.float32 if getattr(param, "keep_float32", False) else dtype
        stored = loader.stored_dtype(pname, shapes[pname])  # read as stored, cut, then converted: only
        full = loader.parameter(pname, shapes[pname], stored or want)  # the rank's piece is ever converted
        piece = with_offset(param, slice_tensor(pname, full, ckpt.config, tp.rank, tp.world).to(want))
        assert tuple(piece.shape) == tuple(param.shape), (pname, piece.shape, param.shape)
        set_parameter(model, pname, piece)  # (a dim-0 block of a mapped tensor stays a view of the file)
        if piece.untyped_storage().data_ptr() != full.untyped_storage().data_ptr():
            loader.consume(pname, shapes[pname], is_copied=True)  # nothing views its mapped pages: drop them
    loader.warn_unused()
    model = model.to(device).eval()
    if device.type == "cpu" and dtype == torch.float32 and kernels.available():
        made = quantize_loaded(model, quantize, prefill_dtype())
        if kind := table_from_loaded(model, quantize):
            made[f"{kind} embedding"] += 1
        if made:
            log.info("quantized linear layers (%s): %s", quantize, dict(made))
        wrap_float_linears(model, quantize)
        absorb_mla(model, quantize)
    log.info(
        "tensor-parallel rank %d of %d: %.2f GiB of weights in %.1fs",
        tp.rank, tp.world, weight_bytes(model) / 2**30, time.perf_counter() - t0,
    )  # fmt: skip
    return model


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters, buffers, quantized weights and kept embedding tables, each tensor's
    own bytes counted once (a tied head sharing the table's bytes, or views of one mapped file, are not
    counted twice; the rest of a mapped file is not counted at all)."""
    seen: dict[int, int] = {}
    tensors = [*model.parameters(), *model.buffers()]
    for m in model.modules():
        if isinstance(m, QuantizedLinear) and isinstance(m.qweight, MappedWeight):
            seen[m.qweight.rows.data_ptr()] = m.qweight.nbytes  # rows in the map, counted once each
        elif isinstance(m, QuantizedLinear):
            tensors.append(m.qweight.data)
        elif isinstance(m, QuantizedEmbedding):
            tensors.append(m.table.data)
    for t in tensors:
        if t.device.type != "meta":
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
    return sum(seen.values())


def prefill_dtype() -> torch.dtype | None:
    """The dtype of quantized layers' dense tensors for prefill GEMMs (model/qlinear.py), or None: prefill
    runs the same kernels as decode and the weights are held once. Opt-in, on any CPU:
    `BLAZR_PREFILL_DENSE=bfloat16|float32` (`none`: the default). A layer whose weight already is that
    dtype uses it as is; every other one gets a dequantized copy.

    Measured on a 2-core Sapphire Rapids (AMX) at the 1B shape (NOTES §36), a bf16 copy through oneDNN's
    AMX tiles prefills 2.8-2.9x faster than the kernels (Q4_K_M 351 vs 126 tok/s, Q8_0 312 vs 108) but
    loads in 5.7-6.5 s instead of 0.2 (every tensor dequantized) and holds 3.3-3.8 GiB instead of 1.0-1.4
    (2.7-3.1x llama.cpp's RSS; ~14 GiB more at 8B), and torch's bf16 GEMM returns bf16: prefill's linear
    outputs are rounded to bf16 where decode's are fp32. Without AMX the kernels prefill as fast as a float
    copy (NOTES §20: Zen 3 AVX2 SmolLM2 Q4_1 94 vs 73 tok/s against MKL's sgemm on float32; Zen 4
    AVX512-VNNI 820-920 vs 660-760 against oneDNN's bf16)."""
    choice = os.environ.get("BLAZR_PREFILL_DENSE", "").strip().lower() or "none"
    if choice not in ("none", "float32", "bfloat16"):
        raise UnsupportedError(f"BLAZR_PREFILL_DENSE={choice!r}: expected none, float32 or bfloat16")
    return None if choice == "none" else getattr(torch, choice)
