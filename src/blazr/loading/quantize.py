"""Quantized weights at load time, made straight from the checkpoint before anything else is read: a GGUF's
block tensors kept as stored, or a float checkpoint quantized in place (`--quantize int8|int4|bf16`, like
mistral.rs' ISQ), one tensor at a time.

Modes:
- `auto` (default): GGUF tensors of a type the kernels run (Q4_0 / Q4_1 / Q8_0, the K-quants, MXFP4, F16,
  BF16) stay as stored (their bytes used as-is — a view of the file's map where no rows move, a MappedWeight
  (a row table into the map) where fused parts lie apart (gate|up), gathered where q/k rows are un-permuted;
  Q4_0 / Q4_1 rows packed into the kernel's row groups, Q8_0 linears too where host tuning measured that
  faster, kernels/q8_packed.py; K-quant linears re-laid in 16-row groups where the
  kernels have a group path that gains, kernels/kquant_packed.py), and so does the token embedding table
  (loading/tables.py: a lookup dequantizes only its rows); an HF checkpoint's MXFP4 experts (GPT-OSS's
  `*_blocks` / `*_scales`) stay mxfp4 too, their blocks re-laid in GGUF's nibble order (`mxfp4_as_stored`);
  every other weight stays float.
- `none`: every weight dequantized to the compute dtype (the reference path; MXFP4 experts too, as
  transformers dequantizes them).
- `int8` → ggml Q8_0 (per 32 weights: f16 scale, int8 values; its linears in the layout a GGUF's Q8_0 runs
  as here, `_isq_kind`); `int4` → ggml Q4_1 (per 32 weights: f16
  scale and minimum, 4-bit values); `bf16` → bfloat16 weights (the 16-bit path: half the bytes of fp32,
  fp32 activations). As for a GGUF's quantized tensors, an MXFP4 tensor is then requantized from its
  dequantized values (what the mode asks: every target in its kind), not kept.

Targets (`quantize_from_file`): every linear called only through its forward — each mixer kind's declared ones
(`MixerSpec.linears`: attention qkv/o, Mamba2 in/out projections, MLA q/kv_a/o projections), dense MLP, MoE
shared experts and latent projections, every linear of a Zamba2 shared block, Gemma 4's per-layer projection
and gates — and the lm_head (tied embeddings: a quantized copy of the embedding); and (`stack_experts`) the
routed MoE experts, stacked in one kernel weight per layer and projection. The token table itself stays as
stored under `auto` and becomes Q8_0 / bf16 rows under `int8` / `int4` / `bf16`; Gemma 4's per-layer table
likewise, and otherwise keeps a 16-bit checkpoint's rows (loading/tables.py). Not the
linears a kind keeps float (`MixerSpec.float_linears`: MLA's kv_b_proj, read directly by the absorbed decode)
or routers. Quantized layers run on blazr's C kernels on the CPU with float32 activations; `dense_dtype`
(loader.py `prefill_dtype`, on request only) adds a dense tensor for prefill GEMMs (see model/qlinear.py).
Under `int8` / `int4` / `bf16` a weight the quantization cache holds (loading/quant_cache.py: what the first
load of the same checkpoint made) is mapped from its file instead, and each weight made in fresh memory is
handed to it (`in_situ`); under `auto` likewise each K-quant re-laid in 16-row groups and each BF16 weight
coded (loading/relaid.py).
`wrap_float_linears` puts the float32 targets left over on the f32 kernel, without a copy (coded where the
host decodes f32z, as bf16 where bf16 holds every value; `code_float_experts` codes float32 expert stacks
alike). How a weight is made from where its rows lie in the checkpoint's map (kept as stored, quantized in
place): loading/stored.py.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch import nn

from blazr.errors import UnsupportedError
from blazr.kernels import ops as kernel_ops
from blazr.kernels import q8_packed
from blazr.kernels.mapped import MappedWeight
from blazr.kernels.quant import (
    FLOAT_KINDS,
    Q8_0G,
    QuantizedWeight,
    dequantize,
    quantize,
)
from blazr.kernels.row_table import RowTable
from blazr.loading.quant_cache import QuantCache
from blazr.loading.relaid import cached_coded, coded, coded_or_narrowed, relaid
from blazr.loading.stored import (
    bf16_as_stored,
    gguf_blocks,
    is_copy,
    mxfp4_as_stored,
    quantized_in_place,
)
from blazr.loading.weights import WeightLoader, set_parameter
from blazr.model import mixers
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.model import CausalLM
from blazr.model.moe import Experts
from blazr.model.qlinear import Linear, QuantizedLinear

MODES = ("auto", "none", "int8", "int4", "bf16")
# int8 → Q8_0 in ggml's row order (q8_0g, linear_q8.c): the same values as packed q8_0, decoding faster in
# place (granite-4.0-h-350m: its linears 18.6 → 15.9 ms a token; NOTES §33) — or, where host tuning measured
# the row-packed layout faster (kernels/q8_packed.py), that layout for the linears a GGUF's Q8_0 is re-laid
# in (`_isq_kind`)
_ISQ_KIND = {"int8": "q8_0g", "int4": "q4_1", "bf16": "bf16"}


# the feed-forward's linears and Gemma 4's per-layer gate (model/per_layer.py); each mixer kind declares
# its own (`MixerSpec.linears`, model/mixers.py)
_FFN_TARGETS = (
    "mlp.gate_up_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "moe.shared.gate_up_proj",
    "moe.shared.up_proj",
    "moe.shared.down_proj",
    "moe.latent_down",  # a latent MoE's projections into and out of the experts' space
    "moe.latent_up",
    "per_layer.gate",
    "per_layer.proj",
)
# whole modules every linear of which is a target: Zamba2's shared blocks, Gemma 4's per-layer projection
_TARGET_MODULES = ("shared_blocks.", "per_layer_inputs.")


def _isq_kind(mode: str, head: bool = False) -> str:
    """The kind `mode` quantizes a linear weight to: `_ISQ_KIND`'s, with int8's linears in the layout a GGUF's
    Q8_0 runs as on this host (`q8_packed.runs_as`: the same values and bits, q8_0 or q8_0g) — not the output
    `head`, which keeps q8_0g's fp32-x form (and, tied, the table's bytes: `_table_as_head`)."""
    kind = _ISQ_KIND[mode]
    return q8_packed.runs_as() if kind == Q8_0G and not head else kind


def check_mode(mode: str, device: torch.device, dtype: torch.dtype) -> None:
    """Reject a quantization request the kernels cannot run (one line, naming what is wrong)."""
    if mode not in MODES:
        raise UnsupportedError(f"unknown --quantize {mode!r}; choose one of {', '.join(MODES)}")
    if mode in _ISQ_KIND and (device.type != "cpu" or dtype != torch.float32):
        raise UnsupportedError(
            f"--quantize {mode} runs on blazr's CPU kernels with float32 activations; found device "
            f"{device.type}, dtype {str(dtype).removeprefix('torch.')} (use --cpu --dtype float32)"
        )


def _targets(model: CausalLM) -> list[tuple[str, nn.Linear | None]]:
    """The float linears to swap, by module name; ("lm_head", None) stands for a tied head (a new layer made
    from the embedding table, which itself stays as it is)."""
    targets = {*mixers.quantizable_linears(), *_FFN_TARGETS}
    found: list[tuple[str, nn.Linear | None]] = [
        (name, m)
        for name, m in model.named_modules()
        if type(m) is Linear and (name.split(".", 2)[-1] in targets or name.startswith(_TARGET_MODULES))
    ]
    if type(model.lm_head) is Linear:
        found.append(("lm_head", model.lm_head))
    elif model.lm_head is None and model.cfg.tie_word_embeddings:
        found.append(("lm_head", None))
    return found


def _table_as_head(model: CausalLM, kind: str) -> QuantizedWeight | None:
    """A tied head of `kind` that reads the token table's own bytes — `int8`'s q8_0g head over the Q8_0 table
    loading/tables.py `embed_quantized` made (both ggml's rows of the same values), as a Q8_0 GGUF's tied head
    reads its table —, else None. A second quantized copy was 0.1 GB more and, while quantized, 0.19 GB of the
    checkpoint's table mapped: the 1B `--quantize int8` load's peak RSS 1.61 → 1.37-1.42 GiB (NOTES §40)."""
    table = model.embed_tokens.table if isinstance(model.embed_tokens, QuantizedEmbedding) else None
    if kind != Q8_0G or table is None or table.kind != "q8_0":
        return None
    return QuantizedWeight(Q8_0G, table.data, table.num_rows, table.dim)


def _set_module(model: CausalLM, name: str, module: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attr, module)


def quantize_from_file(
    model: CausalLM, loader: WeightLoader, mode: str, dense_dtype: torch.dtype | None
) -> Counter[str]:
    """Replace the target linears of `model` (still on meta) by QuantizedLinear layers made from the
    checkpoint: a GGUF's block tensors as stored (`auto`), or each float weight quantized as it is read
    (`int8` / `int4` / `bf16`). Returns how many layers of each kind were made."""
    made: Counter[str] = Counter()
    if mode == "none":
        return made
    cfg, source = model.cfg, loader.source
    for name, linear in _targets(model):
        if linear is None:  # a tied head: a quantized copy of the embedding
            pname, shape = "embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size)
        else:
            pname, shape = f"{name}.weight", (linear.out_features, linear.in_features)
        if mode == "auto":
            qw = gguf_blocks(cfg, source, loader.names, pname, shape)
            if qw is None:
                continue
            # K-quants in 16-row groups, BF16 coded, where the kernels take them
            qw = relaid(loader.cache, pname, qw, head=name == "lm_head")
            held = qw.holder if isinstance(qw, MappedWeight) else qw.data
            loader.consume(pname, shape, is_copied=is_copy(source, held))
        else:
            kind = _isq_kind(mode, head=name == "lm_head")
            if kind != "bf16" and shape[1] % 32:  # block kinds quantize blocks of 32
                continue
            if linear is None and (shared := _table_as_head(model, kind)) is not None:
                qw = shared
            elif linear is not None and (cached := cached_coded(loader.cache, f"{name}.weight", shape, kind)):
                loader.consume(pname, shape, is_copied=False)
                qw = cached
            elif linear is None and not isinstance(model.embed_tokens, QuantizedEmbedding):
                # the table itself is needed float: load it now, quantize a copy
                weight = loader.parameter(pname, shape)
                set_parameter(model, pname, weight)
                loader.tick()
                qw = quantize(weight, kind)
            else:
                qw = in_situ(loader, pname, shape, kind, entry=f"{name}.weight")
            was = qw.kind
            qw = coded(loader.cache, f"{name}.weight", qw)
            if qw.kind != was and linear is not None:  # coded: the checkpoint rows it viewed are not needed
                loader.consume(pname, shape, is_copied=True)
        bias = None
        if linear is not None and linear.bias is not None:
            bias = loader.parameter(f"{name}.bias", (linear.out_features,), torch.float32)
        _set_module(model, name, QuantizedLinear(qw, bias, _dense_copy(qw, name, dense_dtype)))
        made[qw.kind] += 1
        if linear is not None:
            for _ in linear.parameters():
                loader.tick()
    return made


def in_situ(
    loader: WeightLoader,
    pname: str,
    shape: tuple[int, ...],
    kind: str,
    entry: str | None = None,
    is_stacked: bool = False,
) -> QuantizedWeight:
    """Parameter `pname` [*, K] quantized in situ to `kind`: the quantization cache's copy when it holds one
    (loading/quant_cache.py: a view of its file), else made from the checkpoint — by the C quantizer from
    where the rows lie in the file's map, as the bf16 rows stored (`bf16`), or read float and quantized —
    and, when made in fresh memory, handed to the cache under `entry` (default: `pname`)."""
    cache, entry = loader.cache, entry or pname
    num_rows, k = math.prod(shape[:-1]), shape[-1]
    if cache is not None and (cached := cache.get(entry, kind, num_rows, k)) is not None:
        loader.consume(pname, shape, is_copied=False)
        return cached
    qw = quantized_in_place(loader, pname, shape, kind, is_stacked)
    if qw is None and kind == "bf16" and not is_stacked:
        qw = bf16_as_stored(loader, pname, shape)
    if qw is None:
        weight = loader.parameter(pname, shape, _read_dtype(loader, pname, shape, kind))
        qw = quantize(weight.reshape(num_rows, k), kind)
    if cache is not None and not isinstance(qw, MappedWeight) and is_copy(loader.source, qw.data):
        cache.put(entry, qw)
    return qw


def _read_dtype(loader: WeightLoader, pname: str, shape: tuple[int, ...], kind: str) -> torch.dtype | None:
    """The dtype to read a weight in for quantizing it to `kind`: bf16 for `bf16`; a block kind reads a
    16-bit (bf16 / f16) weight as stored — the C quantizer widens it exactly, so the bytes are those of its
    float32 copy, which is never made; else the loader's dtype (None)."""
    if kind == "bf16":
        return torch.bfloat16
    stored = loader.stored_dtype(pname, shape)
    return stored if stored in (torch.bfloat16, torch.float16) else None


def _dense_copy(qw: QuantizedWeight, name: str, dense_dtype: torch.dtype | None) -> torch.Tensor | None:
    """A quantized layer's dense tensor for prefill GEMMs (`prefill_dtype`), or None."""
    if dense_dtype is None or name == "lm_head":
        return None  # the lm_head sees a few rows per step, and its logits stay fp32 (no bf16 GEMM)
    if qw.kind in FLOAT_KINDS and qw.data.dtype == dense_dtype:
        return qw.data  # the same tensor: no second copy
    return dequantize(qw).to(dense_dtype)


def stack_experts(model: CausalLM, loader: WeightLoader, mode: str) -> Counter[str]:
    """Put the MoE experts of `model` (still on meta) in a kernel weight format, stacked
    (`Experts.set_stacked`), so a token streams only its chosen experts' quantized rows: a GGUF's
    block-quantized expert tensors as stored (`auto`, never dequantized; K-quants re-laid in 16-row groups
    expert by expert where the kernels take them, kernels/kquant_packed.py), or the float experts quantized
    one projection at a time as they are read (`int8` / `int4` / `bf16`). Experts whose rows do not split into
    whole row groups stay float (loaded later with the rest). Returns how many stacks of each kind were
    made."""
    made: Counter[str] = Counter()
    if mode == "none":
        return made
    cfg, source = model.cfg, loader.source
    for name, experts in model.named_modules():
        if not isinstance(experts, Experts) or experts.w_up is not None:
            continue
        up_name = "gate_up_proj" if experts.cfg.is_gated else "up_proj"
        params = [(f"{name}.{up_name}", tuple(getattr(experts, up_name).shape))]
        params.append((f"{name}.down_proj", tuple(experts.down_proj.shape)))
        if mode == "auto":
            stacked = [
                gguf_blocks(cfg, source, loader.names, p, shape, is_stacked=True)
                or mxfp4_as_stored(cfg, source, loader.names, p, shape)
                for p, shape in params
            ]
            if None in stacked:
                continue
            E = experts.num_experts
            stacked = [relaid(loader.cache, p, w, E) for (p, _), w in zip(params, stacked, strict=True)]  # type: ignore[arg-type]
        elif _ISQ_KIND[mode] != "bf16" and any(shape[2] % 32 for _, shape in params):
            continue  # block kinds quantize blocks of 32
        else:
            kind = _ISQ_KIND[mode]
            stacked = [
                cached_coded(loader.cache, p, (math.prod(shape[:-1]), shape[-1]), kind)
                or coded(loader.cache, p, in_situ(loader, p, shape, kind, is_stacked=True))
                for p, shape in params
            ]
        try:
            experts.set_stacked(*stacked)  # type: ignore[arg-type]
        except ValueError:  # an expert's rows straddle a row group: keep them float
            continue
        for (p, shape), w in zip(params, stacked, strict=True):
            loader.consume(p, shape, is_copied=is_copy(source, w.data))  # type: ignore[union-attr]
            loader.tick()
        made[f"{stacked[0].kind} experts"] += 1  # type: ignore[union-attr]
    return made


def quantize_loaded(model: CausalLM, mode: str, dense_dtype: torch.dtype | None) -> Counter[str]:
    """`quantize_from_file` for a model already loaded in float32 (a tensor-parallel shard, whose weights
    are slices made in memory): each target linear quantized to `mode`'s kind (`int8` / `int4` / `bf16`;
    `auto` / `none`: nothing), its float weight dropped (the token table after it: loading/tables.py
    `table_from_loaded`). Returns how many layers of each kind were made."""
    made: Counter[str] = Counter()
    if mode not in _ISQ_KIND:
        return made
    for name, linear in _targets(model):
        weight = model.embed_tokens.weight if linear is None else linear.weight
        kind = _isq_kind(mode, head=name == "lm_head")
        if kind != "bf16" and weight.shape[1] % 32:  # block kinds quantize blocks of 32
            continue
        qw = quantize(weight.detach(), kind)
        bias = None if linear is None or linear.bias is None else linear.bias.detach()
        _set_module(model, name, QuantizedLinear(qw, bias, _dense_copy(qw, name, dense_dtype)))
        made[qw.kind] += 1
    return made


def kernel_prefill_f32() -> bool:
    """Whether float32 prefill runs blz_linear_f32 rather than torch's sgemm: where the kernel's many-row path
    is gemm_float.c's panel GEMM (AVX2 hosts without AVX-512). On the Zen 3 host (2 threads) it ran 0.98–1.4x
    MKL's sgemm at 500 rows and 1.2–2.1x at 16–64 (Llama-3.2-1B's shapes; level at 768-wide ones), and the
    four hybrid families' float32 prefill went 1.03–1.46x → 1.27–1.51x llama.cpp's (NOTES §35); its rows are
    independent by construction, where the sgemm's rounding depends on M below 12 rows. On AVX-512 hosts the
    panel runs 512-bit (Sapphire Rapids, 1B shapes: 250–320 GFLOP/s at 500 rows) but torch's sgemm there
    measured 1.05–1.2x it at 500 rows (NOTES §37), so those kept the sgemm. Which runs faster is the host's
    (on Zen 5 the panel ran 1.3-2.4x MKL's sgemm): the choice host tuning measured (kernels/tuning.py
    `f32_prefill`), else that rule."""
    from blazr.kernels import tuning

    lib = kernel_ops.kernels()
    if lib is None or "avx2" not in lib.features:
        return False
    measured = tuning.CHOICES.get("f32_prefill")
    return measured == "kernel" if measured else "avx512" not in lib.features


def wrap_float_linears(model: CausalLM, mode: str = "auto", cache: QuantCache | None = None) -> int:
    """Put the float32 target linears left after `quantize_from_file` on the C kernels: each becomes a
    QuantizedLinear of kind f32 whose weight *is* the loaded tensor (no copy). Under `auto`, where the host
    decodes coded weights and its float32 prefill runs the kernel's panel GEMM, the weight is coded instead
    (f32z, kernels/coded.py: every bit, in 7/8 of the bytes a decode step reads; bf16z, in 3/8, where bf16
    holds every value — a float32 copy of bf16 weights, as an F32 GGUF of a published checkpoint is; prefill
    decodes 16 rows at a time into the panel) — the quantization cache's copy when it holds one, else coded
    here and handed to `cache` (~1 GB/s: 3.4 s for Qwen3.5-0.8B's 3.2 GB) —; a weight of bf16 values that this
    host does not code is kept as those bf16 values (half the bytes; `relaid.coded_or_narrowed`), and a tied
    head's token table then looks its rows up in the head's bytes; `none` keeps every f32 tensor as loaded
    (the reference path). A decode-only forward streams the weight through blz_linear_f32
    (benchmarks/kernels.py on a Zen 1 host, one row, cold weights: 15–18 GB/s against torch's 10–13). Prefill
    runs the kernel too where its many-row path is gemm_float.c's panel GEMM (`kernel_prefill_f32`); elsewhere
    the layer's dense copy is that same tensor, and prefill keeps torch's GEMM. A tied lm_head wraps the
    embedding table itself. Returns how many layers were wrapped."""
    wrapped, on_panel = 0, kernel_prefill_f32()
    for name, linear in _targets(model):  # after quantize_from_file: the float linears it left
        weight = model.embed_tokens.weight if linear is None else linear.weight
        if weight.dtype != torch.float32 or not weight.is_cpu:
            continue
        qw = quantize(weight.detach(), "f32")  # a view of the same storage
        bias = None if linear is None or linear.bias is None else linear.bias.detach()
        dense = None if linear is None or on_panel else qw.data  # the lm_head sees few rows: the kernel
        if mode == "auto" and on_panel and (linear is not None or model.tp is None):
            qw = coded_or_narrowed(cache, f"{name}.weight", qw)
            if linear is None and qw.kind != "f32":  # a tied head: the table reads the same rows
                table = RowTable(qw.kind, qw.data.view(torch.uint8), qw.out_features, qw.in_features)
                model.embed_tokens = QuantizedEmbedding(table)
        _set_module(model, name, QuantizedLinear(qw, bias, dense))
        wrapped += 1
    return wrapped


def code_float_experts(model: CausalLM, cache: QuantCache | None = None) -> int:
    """Under `auto`, where `wrap_float_linears` codes float32 linears, each float32 MoE expert stack left as
    loaded coded too (f32z, or bf16z where bf16 holds its values: kernels/coded.py; such values stored bf16
    where not coded), one projection at a time (the cache's copy when it holds one): a decode step then reads
    its chosen experts' rows in 7/8 of the bytes (3/8 or 1/2 for bf16 values), and a prefill runs each
    expert's rows on the panel GEMM (csrc/moe.c runs them by weight code) instead of torch's per-expert GEMMs.
    The float parameters are dropped; a stack with each projection still f32 stays as loaded. Returns how many
    layers' experts were coded."""
    if model.tp is not None or not kernel_prefill_f32():
        return 0
    made = 0
    for name, experts in model.named_modules():
        if not isinstance(experts, Experts) or experts.w_up is not None:
            continue
        names = ("gate_up_proj" if experts.cfg.is_gated else "up_proj", "down_proj")
        params = [getattr(experts, n) for n in names]
        if any(p.dtype != torch.float32 or not p.is_cpu for p in params):
            continue
        stacked = [
            coded_or_narrowed(cache, f"{name}.{n}", quantize(p.detach().reshape(-1, p.shape[-1]), "f32"))
            for n, p in zip(names, params, strict=True)
        ]
        if all(w.kind == "f32" for w in stacked):
            continue
        experts.set_stacked(*stacked)
        made += 1
    return made
