"""Hybrid models at published shapes, blazr vs llama.cpp on the same weights (random: speed only).

    python benchmarks/hybrid_peers.py [--models NAME,...] [--precisions f32,16,q8,q4[,q4km,f32b]]
                                      [--prompt-len 500] [--gen 128] [--rounds 3] [--threads N]
                                      [--batched int8]   (--precisions "" for the batched table alone)

For each model: transformers builds the HF checkpoint at the published config (random weights, seeded,
cached under benchmarks/.cache/hybrid/), a tokenizer llama.cpp's converter accepts is saved beside it
(SmolLM2's, exported from the embedded GGUF), and llama.cpp's own `convert_hf_to_gguf.py` — from the
llama-cpp-python sdist that `make test` unpacks (or LLAMA_CPP_SDIST; else fetched into the cache) —
writes F32, F16 and Q8_0 GGUFs; Q4_0 comes from llama.cpp's quantizer. blazr loads the
safetensors directory with the matching --quantize (auto / bf16 / int8 / int4), and the Q8_0 / Q4_0 GGUFs
themselves (blocks kept as stored).

Each row: a prompt of --prompt-len random tokens then --gen greedy tokens; prefill tok/s = prompt / time to
the first token, decode tok/s = (gen − 1) / the rest (as benchmarks/run.py). Medians of --rounds rounds
after a warm-up round, engines interleaved within a round. Peak RSS of a whole load is not comparable in
one process, so load time only is printed beside each row. --batched QUANTIZE adds blazr's continuous
batching table per model (aggregate decode tok/s at 1 / 4 / 8 / 16 sequences, as benchmarks/run.py's
table 2, blazr alone). --batched-peer LLAMA_BATCHED_BENCH sets blazr's batched decode at --levels
(1,4,16) on the GGUFs of --batched-formats (Q8_0 by default; F32,F16,Q8_0,Q4_0) beside llama.cpp's
parallel sequences (llama-batched-bench: hybrid_batched.py),
and --alone [NAME,...] adds Zamba2 and OLMo-Hybrid, which llama.cpp cannot load, beside transformers
(benchmarks/hybrid_alone.py). The issue-42 tables:

    python benchmarks/hybrid_peers.py --precisions "" --rounds 2 --batched-formats F32,F16,Q8_0,Q4_0 \\
        --models lfm2-350m,qwen3.5-0.8b,jamba-block-1024,mamba-130m,\\
qwen3-next-scaled-0.85b,kimi-linear-scaled-0.88b \\
        --batched-peer "$(python benchmarks/llama_tools.py llama-batched-bench)"
    python benchmarks/hybrid_peers.py --precisions "" --models "" --alone --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import hybrid_batched  # noqa: I001
from benchmarks.host import host_line
from benchmarks.read_rate import decode_bytes
from benchmarks.run import Row, load_blazr, load_llama_cpp, log, measure_single, prompt_ids
from benchmarks.run import batching_table, measure_batching, single_table, spread_note, versions
from tests import llama_cpp_convert
from tests.llama_cpp_convert import (
    export_tokenizer,
    granite_as_published,
    kimi_as_published,
    kimi_weights_as_published,
    nemotron_as_published,
    spm_tokenizer,
)
from tests.tiny import CONFIG_CLASSES

CACHE = Path(__file__).parent / ".cache" / "hybrid"
SDIST = "llama-cpp-python==0.3.36"

# The 52-block pattern of nvidia/Nemotron-H-4B-Base-8K: M = Mamba2, - = MLP, * = attention.
NEMOTRON_H_4B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


# name → (transformers architecture, config (sizes only), edit of the saved config.json for the converter).
# Published configs (config.json of each repository) where one of similar size exists; Nemotron-H's
# smallest is 4B, so its row keeps the 4B's block pattern, vocabulary, head / state sizes and width ratios
# at granite-350m's width (768; ~445M parameters). Falcon-H1-0.5B's vocabulary grows to the exported
# tokenizer's 49152 ids (llama.cpp's converter refuses a tokenizer larger than the embedding).
MODELS: dict[str, tuple[str, dict, Callable[[dict], None] | None]] = {
    "granite-4.0-h-350m": (
        "GraniteMoeHybridForCausalLM",
        dict(
            vocab_size=100352,
            hidden_size=768,
            num_hidden_layers=32,
            layer_types=[
                "full_attention" if i in (10, 13, 17, 27) else "linear_attention" for i in range(32)
            ],
            num_attention_heads=12,
            num_key_value_heads=4,
            intermediate_size=2048,
            shared_intermediate_size=2048,
            num_local_experts=0,
            num_experts_per_tok=0,
            mamba_n_heads=48,
            mamba_d_head=32,
            mamba_n_groups=1,
            mamba_d_state=128,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_chunk_size=256,
            position_embedding_type="nope",
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            embedding_multiplier=12.0,
            residual_multiplier=0.246,
            attention_multiplier=0.015625,
            logits_scaling=3.0,
        ),
        granite_as_published,
    ),
    "mamba2-130m": (
        "Mamba2ForCausalLM",
        dict(
            vocab_size=50288,
            hidden_size=768,
            num_hidden_layers=24,
            state_size=128,
            expand=2,
            head_dim=64,
            num_heads=24,
            n_groups=1,
            conv_kernel=4,
            chunk_size=256,
            tie_word_embeddings=True,
        ),
        None,
    ),
    "nemotron-h-4b-pattern-768": (
        "NemotronHForCausalLM",
        dict(
            vocab_size=131072,
            hidden_size=768,
            hybrid_override_pattern=NEMOTRON_H_4B_PATTERN,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=128,
            intermediate_size=3072,
            mlp_hidden_act="relu2",
            mamba_num_heads=24,
            mamba_head_dim=64,
            n_groups=8,
            ssm_state_size=128,
            conv_kernel=4,
            chunk_size=128,
            tie_word_embeddings=False,
            max_position_embeddings=8192,
        ),
        partial(nemotron_as_published, pattern=NEMOTRON_H_4B_PATTERN),
    ),
    "falcon-h1-0.5b": (
        "FalconH1ForCausalLM",
        dict(
            vocab_size=49152,  # published: 32784, under the converter-friendly tokenizer's 49152 ids
            hidden_size=1024,
            num_hidden_layers=36,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=64,
            intermediate_size=2048,
            mamba_d_ssm=1536,
            mamba_n_heads=24,
            mamba_d_head=64,
            mamba_n_groups=1,
            mamba_d_state=128,
            mamba_d_conv=4,
            mamba_chunk_size=128,
            mamba_rms_norm=False,
            mamba_norm_before_gate=False,
            tie_word_embeddings=False,
            max_position_embeddings=16384,
        ),
        None,
    ),
    # MoE hybrid: ibm-granite/granite-4.0-h-tiny's published layer shapes (1536 wide, 64 experts of 512, 6
    # per token, a shared MLP of 1024, Mamba2 48 × 64 heads, state 128) in 10 of its 40 blocks (one
    # attention block), so that the float checkpoint the converter reads fits this machine (1.7B parameters).
    "granite-4.0-h-tiny-10-blocks": (
        "GraniteMoeHybridForCausalLM",
        dict(
            vocab_size=100352,
            hidden_size=1536,
            num_hidden_layers=10,
            layer_types=["full_attention" if i == 5 else "linear_attention" for i in range(10)],
            num_attention_heads=12,
            num_key_value_heads=4,
            intermediate_size=512,
            shared_intermediate_size=1024,
            num_local_experts=64,
            num_experts_per_tok=6,
            mamba_n_heads=48,
            mamba_d_head=64,
            mamba_n_groups=1,
            mamba_d_state=128,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_chunk_size=256,
            position_embedding_type="nope",
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.0078125,
            logits_scaling=6.0,
        ),
        granite_as_published,
    ),
    # MLA + MoE: deepseek-ai/DeepSeek-V2-Lite's published config (27 layers, the first dense; MLA 16 heads,
    # kv_lora 512, no q LoRA; 2 shared + 6 routed experts of 1408 per token) with 8 routed experts instead
    # of 64 (2.6B parameters instead of 15.7B: the float checkpoint must fit this machine; per token the same
    # active work). llama.cpp (0.3.36) treats a deepseek2 file as "lite" (no q LoRA) only at 26 or 27 layers.
    "deepseek-v2-lite-8-experts": (
        "DeepseekV2ForCausalLM",
        dict(
            vocab_size=49152,  # published 102400, under the converter-friendly tokenizer's ids
            hidden_size=2048,
            intermediate_size=10944,
            moe_intermediate_size=1408,
            num_hidden_layers=27,
            num_attention_heads=16,
            num_key_value_heads=16,
            n_shared_experts=2,
            n_routed_experts=8,
            num_experts_per_tok=6,
            routed_scaling_factor=1.0,
            kv_lora_rank=512,
            q_lora_rank=None,
            qk_rope_head_dim=64,
            v_head_dim=128,
            qk_nope_head_dim=128,
            topk_method="greedy",
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            norm_topk_prob=False,
            max_position_embeddings=163840,
            tie_word_embeddings=False,
        ),
        None,
    ),
    # Gated DeltaNet + gated attention: Qwen/Qwen3.5-0.8B's published text config (24 layers, 3 DeltaNet : 1
    # attention; DeltaNet 16 key / 16 value heads of 128; attention 8 heads of 256, 2 KV heads, a quarter
    # rotated; 248320-token vocabulary, tied).
    # Short convolutions: LiquidAI/LFM2-350M's published config (16 layers, attention at 2, 5, 8, 10, 12, 14;
    # its FFN width 4608 is block_ff_dim 6656 after block_auto_adjust_ff_dim, given directly here).
    "lfm2-350m": (
        "Lfm2ForCausalLM",
        dict(
            vocab_size=65536,
            hidden_size=1024,
            num_hidden_layers=16,
            layer_types=["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
            num_attention_heads=16,
            num_key_value_heads=8,
            intermediate_size=4608,
            block_auto_adjust_ff_dim=False,
            conv_L_cache=3,
            norm_eps=1e-5,
            tie_word_embeddings=True,
            max_position_embeddings=128000,
        ),
        None,
    ),
    # Mamba1: state-spaces/mamba-130m-hf's published config.
    "mamba-130m": (
        "MambaForCausalLM",
        dict(
            vocab_size=50280,
            hidden_size=768,
            num_hidden_layers=24,
            intermediate_size=1536,
            state_size=16,
            conv_kernel=4,
            time_step_rank=48,
            use_bias=False,
            use_conv_bias=True,
            tie_word_embeddings=True,
        ),
        None,
    ),
    # Jamba (Mamba1 + attention + MoE): Jamba v0.1's block — attention at 4 of 8 layers, 16 experts (top 2) in
    # every 2nd layer, state 16, conv 4, expand 2 — at 1024 wide with experts of 1024 (one block of 8 layers,
    # ~0.4B parameters: the size of the tiny development model, whose exact config is not in reach here).
    # Its converter takes only a Llama-style tokenizer: a small SentencePiece model beside SmolLM2's.
    "jamba-block-1024": (
        "JambaForCausalLM",
        dict(
            vocab_size=65536,
            hidden_size=1024,
            num_hidden_layers=8,
            intermediate_size=1024,
            num_attention_heads=16,
            num_key_value_heads=8,
            attn_layer_period=8,
            attn_layer_offset=4,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=16,
            num_experts_per_tok=2,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank=64,
            tie_word_embeddings=False,
            max_position_embeddings=262144,
        ),
        None,
    ),
    "qwen3.5-0.8b": (
        "Qwen3_5ForCausalLM",
        dict(
            vocab_size=248320,
            hidden_size=1024,
            intermediate_size=3584,
            num_hidden_layers=24,
            layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(24)],
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=256,
            linear_num_key_heads=16,
            linear_num_value_heads=16,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=10_000_000.0, partial_rotary_factor=0.25),
            max_position_embeddings=262144,
            tie_word_embeddings=True,
        ),
        None,
    ),
    # Qwen/Qwen3-Next-80B-A3B scaled to 0.86B parameters keeping its layer pattern (3 DeltaNet : 1
    # attention), head sizes and ratios: attention heads of 256 whose q is twice the hidden width, KV heads
    # an eighth of the heads; DeltaNet heads of 128, twice the value heads as key heads (key heads · 128 =
    # the hidden width); experts a quarter of the hidden width, the gated shared expert one expert wide,
    # the active experts 2× the hidden width (published 2.5×): hidden 1024 (½), 16 layers (⅓), 32 experts
    # of 256, 8 per token (published 512 of 512, 10 per token).
    "qwen3-next-scaled-0.85b": (
        "Qwen3NextForCausalLM",
        dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=2560,
            num_hidden_layers=16,
            layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(16)],
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=256,
            linear_num_key_heads=8,
            linear_num_value_heads=16,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            num_experts=32,
            num_experts_per_tok=8,
            moe_intermediate_size=256,
            shared_expert_intermediate_size=256,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=10_000_000.0, partial_rotary_factor=0.25),
            max_position_embeddings=262144,
            tie_word_embeddings=False,
        ),
        None,
    ),
    # moonshotai/Kimi-Linear-48B-A3B scaled to 0.88B parameters keeping its layer pattern (3 KDA : 1 NoPE
    # MLA, the last layer MLA), head sizes and ratios: KDA and MLA heads of 128 (MLA: nope 128, rope 64,
    # value 128, latent 512, no q LoRA), as many KDA heads as MLA heads (llama.cpp reads one count for both)
    # and twice the hidden width; a dense first layer 4× the hidden width; experts a quarter of the hidden
    # width (published 0.44×) with one shared, 8 of 32 per token (published 8 of 256), sigmoid routing
    # scaled by 2.446: hidden 1024 (0.44×), 16 layers (published 27), vocabulary as published.
    "kimi-linear-scaled-0.88b": (
        "KimiLinearForCausalLM",
        dict(
            vocab_size=163840,
            hidden_size=1024,
            intermediate_size=4096,
            moe_intermediate_size=256,
            num_hidden_layers=16,
            layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(16)],
            num_attention_heads=16,
            num_key_value_heads=16,
            kv_lora_rank=512,
            q_lora_rank=None,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            linear_num_heads=16,
            linear_head_dim=128,
            linear_conv_kernel_dim=4,
            num_local_experts=32,
            num_experts_per_tok=8,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=2.446,
            rms_norm_eps=1e-5,
            max_position_embeddings=262144,
            pad_token_id=163839,
            bos_token_id=163584,
            eos_token_id=163586,
            tie_word_embeddings=False,
        ),
        kimi_as_published,
    ),
}

# precision → (blazr --quantize, llama.cpp GGUF type)
# F32: blazr's default (`auto`), which codes a float32 checkpoint's linears (kernels/coded.py: the same bits
# in 7/8 of the bytes); `none` keeps them as loaded (the reference path: 8/7 of the bytes a decode step reads)
PRECISIONS = {"f32": ("auto", "F32"), "16": ("bf16", "F16"), "q8": ("int8", "Q8_0"), "q4": ("int4", "Q4_0")}
# Optional (not in the default list): llama.cpp's Q4_K_M, which blazr runs only as the GGUF — its K-quants
# re-laid in 16-row groups (kernels/kquant_packed.py) and, beside it, kept as stored (BLAZR_KPACK=0).
QUANTIZER_ONLY = {"q4km": "Q4_K_M"}
# "f32b", F32 of bf16 values: the checkpoint saved in bfloat16, as models are published (cached apart, as
# NAME-bf16), and llama.cpp's F32 GGUF of it — every value a bf16, the F32 file users make of a published
# model —, both engines on that very file (blazr codes its linears as bf16z: kernels/coded.py).
BF16_VALUES = {"f32b": "F32"}
# The MoE rows run at Q8_0 only: their float GGUFs (5–10 GB) would take most of a `make bench` to write.
ONLY_Q8 = {"granite-4.0-h-tiny-10-blocks", "deepseek-v2-lite-8-experts"}


def checkpoint(name: str, bf16_values: bool = False) -> Path:
    """The HF safetensors directory of `name` (built once), with a converter-friendly tokenizer; with
    `bf16_values`, the one saved in bfloat16 (NAME-bf16)."""
    arch, cfg, edit = MODELS[name]
    if bf16_values:
        return build_hf(f"{name}-bf16", arch, cfg, edit, bf16_over=0)
    return build_hf(name, arch, cfg, edit)


def random_model(arch: str, cfg: dict, device: str = "cpu") -> torch.nn.Module:
    """transformers' `arch` at `cfg`, float32, eval mode, made on `device` with random weights (seeded) and
    its norms perturbed too: transformers leaves them at 1 (or 0: a (1 + w) norm) and A_log / D constant."""
    import transformers

    config = getattr(transformers, CONFIG_CLASSES.get(arch, arch.replace("ForCausalLM", "Config")))(**cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, arch)(config).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 and pname.endswith("weight"):
                p.copy_((0 if bool((p == 0).all()) else 1) + 0.1 * torch.randn_like(p))
    return model


def build_hf(
    name: str,
    arch: str,
    cfg: dict,
    edit: Callable[[dict], None] | None = None,
    save: Callable[[torch.nn.Module, Path], None] | None = None,
    bf16_over: float = 1e9,
) -> Path:
    """Build (once) CACHE/name/hf: transformers' `arch` at `cfg` with random weights (seeded), saved by
    `save` (default save_pretrained) in bfloat16 past `bf16_over` parameters, config.json edited by `edit`,
    and SmolLM2's tokenizer beside it."""
    out = CACHE / name / "hf"
    if (out / "config.json").exists():
        return out
    log(f"# building {name} with transformers (random weights)")
    model = random_model(arch, cfg)
    if sum(t.numel() for t in model.parameters()) > bf16_over:  # saved in bf16: half the disk and load time
        model = model.to(torch.bfloat16)
    if save is None:
        model.save_pretrained(out)
    else:
        save(model, out)
    if edit is not None:
        cfg_path = out / "config.json"
        saved = json.loads(cfg_path.read_text())
        edit(saved)
        cfg_path.write_text(json.dumps(saved, indent=2))
    export_tokenizer(out)
    if arch == "JambaForCausalLM":  # its converter reads tokenizer.model; blazr the exported tokenizer.json
        spm_tokenizer(out)
    if arch == "KimiLinearForCausalLM":  # the dense MLP under mlp., as moonshotai's files (the converter's)
        kimi_weights_as_published(out)
    return out


def converter() -> Path:
    """llama.cpp's convert_hf_to_gguf.py: the sdist `make test` unpacks (tests/llama_cpp_convert.py), else
    one fetched with `pip download` into the cache (`make bench` alone does not unpack it)."""
    try:
        return llama_cpp_convert.converter()
    except FileNotFoundError:
        pass
    package, version = SDIST.split("==")
    root = CACHE / "sdist"
    unpacked = root / f"{package.replace('-', '_')}-{version}"
    script = unpacked / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not script.exists():
        root.mkdir(parents=True, exist_ok=True)
        log(f"# pip download {SDIST} (the sdist carries llama.cpp's converter)")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SDIST]
        subprocess.run([*cmd, "-d", str(root)], check=True)
        with tarfile.open(next(root.glob("*.tar.gz"))) as tf:
            tf.extractall(root, filter="data")
    return script


def gguf(name: str, kind: str, bf16_values: bool = False) -> Path:
    """A GGUF of `name` (with `bf16_values`: of its bfloat16 checkpoint) in F32 / F16 / Q8_0 (llama.cpp's
    converter) or Q4_0 (its quantizer, from F32)."""
    stem = f"{name}-bf16" if bf16_values else name
    out = CACHE / stem / f"{stem}-{kind}.gguf"
    if out.exists():
        return out
    part = out.with_suffix(".part")  # renamed when whole: a run stopped mid-write leaves no damaged cache
    if kind in ("Q4_0", *QUANTIZER_ONLY.values()):
        llama_cpp_convert.quantize(gguf(name, "F32", bf16_values), part, kind)
    else:
        log(f"# converting {stem} to {kind} with llama.cpp's convert_hf_to_gguf.py")
        llama_cpp_convert.convert(checkpoint(name, bf16_values), None, part, kind.lower(), converter())
    return part.replace(out)


def _as_stored(ids: list[int], gen: int, path: Path) -> Callable[[], tuple[float, float]]:
    """blazr on `path` with every K-quant kept in its stored layout (BLAZR_KPACK=0 while it loads)."""
    os.environ["BLAZR_KPACK"] = "0"
    try:
        return load_blazr(ids, gen, path)
    finally:
        del os.environ["BLAZR_KPACK"]


def rows(name: str, precisions: list[str], ids: list[int], gen: int, threads: int) -> list[Row]:
    """Per precision: llama.cpp on its GGUF, blazr on the safetensors with the matching --quantize, and for
    the block types blazr on llama.cpp's very GGUF (kept quantized, loading/gguf_hf.py)."""
    hf, out = checkpoint(name), []
    for p in precisions:
        if name in ONLY_Q8 and p != "q8":
            continue
        if p in BF16_VALUES:
            path = gguf(name, BF16_VALUES[p], bf16_values=True)
            nb, label = decode_bytes(path), f"{name} {BF16_VALUES[p]} GGUF of bf16 values"
            out.append(
                Row("llama.cpp", label, p, partial(load_llama_cpp, path, ids, gen, threads), weight_bytes=nb)
            )
            out.append(Row("blazr", label, p, partial(load_blazr, ids, gen, path), weight_bytes=nb))
            continue
        if p in QUANTIZER_ONLY:
            kind = QUANTIZER_ONLY[p]
            path = gguf(name, kind)
            nb, peer_load = decode_bytes(path), partial(load_llama_cpp, path, ids, gen, threads)
            out.append(Row("llama.cpp", f"{name} {kind} GGUF", p, peer_load, weight_bytes=nb))
            out.append(
                Row("blazr", f"{name} {kind} GGUF", p, partial(load_blazr, ids, gen, path), weight_bytes=nb)
            )
            stored = partial(_as_stored, ids, gen, path)
            out.append(Row("blazr", f"{name} {kind} GGUF as stored", p, stored, weight_bytes=nb))
            continue
        quantize, kind = PRECISIONS[p]
        path = gguf(name, kind)
        nb = decode_bytes(path)  # a token's weight bytes, for every row of the precision (bf16 as F16, …)
        peer_load = partial(load_llama_cpp, path, ids, gen, threads)
        peer = Row("llama.cpp", f"{name} {kind} GGUF", p, peer_load, weight_bytes=nb)
        ours = Row(
            "blazr",
            f"{name} --quantize {quantize}",
            p,
            lambda q=quantize: load_blazr(ids, gen, hf, quantize=q),
            weight_bytes=nb,
        )
        out += [peer, ours]
        if kind.startswith("Q"):
            load = partial(load_blazr, ids, gen, path)
            out.append(Row("blazr", f"{name} {kind} GGUF", p, load, weight_bytes=nb))
    return out


def report(
    models: list[str], precisions: list[str], prompt_len: int, gen: int, rounds: int, threads: int
) -> str:
    """One table per model: blazr and llama.cpp per precision, ratios against llama.cpp's row."""
    parts = []
    for name in models:
        vocab = json.loads((checkpoint(name) / "config.json").read_text())["vocab_size"]
        ids = prompt_ids(prompt_len, min(vocab, 49152))  # ids the exported tokenizer knows
        t0 = time.perf_counter()
        measured = measure_single(rows(name, precisions, ids, gen, threads), rounds, prompt_len, gen)
        log(f"# {name} done in {time.perf_counter() - t0:.0f} s")
        parts += [
            f"### {name} (random weights, published shape)",
            "",
            f"Prompt {prompt_len} random tokens, {gen} greedy tokens; median of {rounds} interleaved rounds "
            "after a warm-up round. × llama.cpp: against llama.cpp's row of the same precision.",
            "",
            single_table(measured),
            "",
            spread_note(measured),
            "",
        ]
    return "\n".join(parts)


def batched_report(models: list[str], quantize: str, rounds: int) -> str:
    """blazr's aggregate decode tok/s at 1 / 4 / 8 / 16 sequences (128-token prompts, 32 tokens each)."""
    parts = []
    for name in models:
        hf = checkpoint(name)
        vocab = min(json.loads((hf / "config.json").read_text())["vocab_size"], 49152)
        rates = measure_batching(128, 32, rounds, hf, vocab=vocab, quantize=quantize)
        parts += [
            f"### {name}, blazr --quantize {quantize}: continuous batching",
            "",
            batching_table(rates),
            "",
        ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help=f"of {[*PRECISIONS, *BF16_VALUES, *QUANTIZER_ONLY]}",
    )
    ap.add_argument("--prompt-len", type=int, default=500)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batched", metavar="QUANTIZE", help="also blazr's batched decode table (e.g. int8)")
    ap.add_argument(
        "--batched-peer", metavar="LLAMA_BATCHED_BENCH", type=Path,
        help="also batched decode on the GGUFs beside this llama-batched-bench (hybrid_batched.py)",
    )  # fmt: skip
    ap.add_argument("--batched-formats", default="Q8_0", help="its GGUFs, of F32,F16,Q8_0,Q4_0")
    ap.add_argument("--levels", default="1,4,16", help="sequence counts of the --batched-peer table")
    ap.add_argument(
        "--alone", nargs="?", const="all", metavar="NAME,...",
        help="also the models llama.cpp cannot load, beside transformers (hybrid_alone.py)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("# blazr vs llama.cpp: hybrid models at published shapes\n")
    print(f"- machine: {host_line()}\n- versions: {versions()}\n- threads: {args.threads} for every engine\n")
    models, precisions = [m for m in args.models.split(",") if m], args.precisions.split(",")
    if precisions != [""]:
        print(report(models, precisions, args.prompt_len, args.gen, args.rounds, args.threads))
    if args.batched:
        print(batched_report(models, args.batched, args.rounds))
    if args.batched_peer:
        levels = tuple(int(n) for n in args.levels.split(","))
        vocab = [json.loads((checkpoint(m) / "config.json").read_text())["vocab_size"] for m in models]
        kinds = args.batched_formats.split(",")
        files = [(m, k, gguf(m, k), min(v, 49152)) for m, v in zip(models, vocab, strict=True) for k in kinds]
        print(hybrid_batched.report(files, args.batched_peer, levels, args.rounds, args.threads))
    if args.alone:
        from benchmarks import hybrid_alone

        alone = list(hybrid_alone.MODELS) if args.alone == "all" else args.alone.split(",")
        print(hybrid_alone.report(alone, args.prompt_len, args.gen, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
