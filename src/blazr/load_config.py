"""`LoadConfig`: what to load and how — checkpoint, vocabulary, device, dtypes, weight quantization, chat
template, threads, tensor-parallel ranks. Frozen and validated; the fields' `option(...)` metadata makes
them flags (config_flags.py). Not to be confused with config.py's `ModelConfig`, a network's architecture.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from blazr.config_flags import option, positive_int

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
QuantizeMode = Literal["auto", "none", "int8", "int4", "bf16"]
HeadPrecision = Literal["auto", "fp32", "int8"]


@dataclass(frozen=True)
class LoadConfig:
    """Model loading: checkpoint, tokenizer, device, dtypes, quantization, ranks."""

    model: str | None = option(
        None,
        aliases=("-m",),
        help="checkpoint dir, .safetensors/.gguf file or HF repo id (default: embedded SmolLM2)",
    )
    vocab: str | None = option(
        None, help="tokenizer vocabulary name (cl100k_base, llama3, deepseek_v3, o200k_base, …)"
    )
    cpu: bool = option(False, help="run on the CPU even when CUDA is available")
    dtype: DtypeName = option("auto", help="weights' and activations' dtype (auto: float32 on the CPU)")
    quantize: QuantizeMode = option(
        "auto",
        help="linear weights on the CPU: auto keeps a GGUF's tensors as stored (Q4_0/Q4_1/Q8_0, K-quants, "
        "F16/BF16); int8 / int4 / bf16 convert any checkpoint at load (Q8_0 / Q4_1 blocks, bfloat16) and "
        "keep the result for later loads (BLAZR_QUANT_CACHE=DIR|off, default ~/.cache/blazr/quantized); "
        "none keeps float weights",
    )
    head_precision: HeadPrecision = option(
        "auto",
        help="activations into an output head kept as Q8_0 (a Q8_0 GGUF's, Gemma's / SmolLM2's tied "
        "heads, int8's): fp32 keeps x as computed against the weights widened exactly — the float model's "
        "logits up to fp32 rounding —, int8 rounds x to 8 bits per block as every other quantized linear "
        "(and llama.cpp) does; fp32 reads as fast at one or two rows a call and costs fp32 FMAs beyond "
        "(SmolLM2 at 16 sequences: 0.77× the throughput); auto: fp32 when max_num_seqs × (1 + speculative "
        "drafts) ≤ 2",
    )
    kv_cache_dtype: DtypeName = option(
        "auto",
        help="attention K/V cache element type: auto is float16 on the CPU with quantized or 16-bit weights "
        "(as llama.cpp), else the model dtype",
    )
    chat_template: str | None = option(
        None, metavar="FILE", help="jinja chat template overriding the model's"
    )
    num_threads: int | None = option(
        None,
        parse=positive_int,
        help="CPU threads of the engine (default on CPU: one per core; `serve` above 2 cores leaves one to "
        "HTTP)",
    )
    tensor_parallel_size: int = option(
        1,
        parse=positive_int,
        aliases=("-tp",),
        metavar="N",
        help="split the model over N ranks (torch.distributed: gloo on the CPU, NCCL on CUDA); blazr starts "
        "ranks 1..N-1 on this machine, or run every rank under torchrun (several nodes too)",
    )

    def __post_init__(self) -> None:
        for what, value, allowed in (
            ("dtype", self.dtype, DtypeName),
            ("kv cache dtype", self.kv_cache_dtype, DtypeName),
            ("quantize mode", self.quantize, QuantizeMode),
            ("head precision", self.head_precision, HeadPrecision),
        ):
            names = typing.get_args(allowed)
            if value not in names:
                raise ValueError(f"unknown {what} {value!r}; expected {', '.join(names)}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads {self.num_threads}: expected an integer ≥ 1")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size}: expected an integer ≥ 1")
