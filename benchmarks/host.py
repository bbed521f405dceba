"""The host line every benchmark table is printed with: the CPU (model, vendor / family / model / stepping —
a VM may name only "AMD EPYC"), the ISA extensions that matter to the kernels of both engines, blazr's kernel
build (its SIMD paths) and the kernel variants this host's tuning chose (blazr/kernels/tuning.py), and
llama.cpp's build flags. Tables from different hosts are only comparable with it beside them."""

from __future__ import annotations

import os

import torch

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")


def llama_cpp_build() -> str:
    """llama.cpp's enabled build features (llama_print_system_info), or why there are none."""
    try:
        import llama_cpp
    except ImportError:
        return "not installed"
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    on = [kv.split("=")[0].strip() for kv in info.split("|") if kv.strip().endswith("= 1")]
    return " ".join(on) or info.strip()


def blazr_kernels() -> str:
    """blazr's kernel library for this host: its SIMD paths and tuned variants."""
    from blazr.kernels import build, ops

    k = ops.kernels()
    if k is None:
        return "unavailable (torch reference path)"
    tuned = ", ".join(f"{name}={k.get_tune(name)}" for name in k.tune_defaults)
    return f"{build.loaded_name()} (simd: {', '.join(k.features) or 'scalar'}; tuned: {tuned})"


def host_line() -> str:
    """One line naming the machine a table was measured on."""
    from blazr.kernels.build import cpu_flags, cpu_model, usable_cores

    flags = set(cpu_flags().split())
    have = " ".join(f for f in FLAGS if f in flags) or "none of " + " ".join(FLAGS)
    return (
        f"{cpu_model()}, {os.cpu_count()} cores ({usable_cores()} usable); ISA: {have}; "
        f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}; blazr kernels {blazr_kernels()}; "
        f"llama.cpp: {llama_cpp_build()}"
    )
