"""Hybrids llama.cpp cannot load (Zamba2, OLMo-Hybrid): blazr beside transformers, the only peer.

    python benchmarks/hybrid_peers.py --precisions "" --alone [zamba2-1.2b-pattern-1024,olmo-hybrid-...]
                                      [--prompt-len 500] [--gen 128] [--rounds 3] [--threads N]

Each model is built once by transformers at a scaled published shape (random weights, seeded, saved in
bfloat16 under benchmarks/.cache/hybrid/NAME/hf, ≤ 1 GB each) with SmolLM2's tokenizer beside it
(hybrid_peers.build_hf). Rows: blazr on the safetensors with --quantize none / bf16 / int8, and
transformers (`AutoModelForCausalLM`, float32 and bfloat16; greedy with its cache and the last position's
logits only, as `generate` does). Prefill tok/s = prompt / time to the first token, decode tok/s =
(gen − 1) / the rest; medians of --rounds interleaved rounds after a warm-up round (run.measure_single).
× transformers: against transformers' row of the same precision (int8: its float32 row).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.hybrid_peers import build_hf
from benchmarks.run import (
    Row,
    Runner,
    load_blazr,
    log,
    measure_single,
    prompt_ids,
    spread_note,
    transformers_runner,
)


def olmo_hybrid_save(model: torch.nn.Module, out: Path) -> None:
    """The published file layout (q / k / v convs apart): tests/test_hf_olmo_hybrid.py's."""
    from tests.test_hf_olmo_hybrid import save_as_published

    save_as_published(model, out)


# name → (transformers architecture, config, how to save). Neither family has a published checkpoint under
# 1B, so each keeps its smallest release's layer pattern, head sizes and ratios at half its width or less.
MODELS: dict[str, tuple[str, dict, Callable[[torch.nn.Module, Path], None] | None]] = {
    # Zyphra/Zamba2-1.2B (38 Mamba2 layers, one shared attention + MLP block called at layers 6, 12 … 36
    # through per-call LoRA adapters of rank 128, rope in the shared attention, Mamba2 heads of 64, state 128,
    # Mistral's 32000-token vocabulary, tied) at hidden 1024 instead of 2048 (~0.3B parameters).
    "zamba2-1.2b-pattern-1024": (
        "Zamba2ForCausalLM",
        dict(
            vocab_size=32000,
            hidden_size=1024,
            num_hidden_layers=38,
            layers_block_type=["hybrid" if i and i % 6 == 0 else "mamba" for i in range(38)],
            num_mem_blocks=1,
            num_attention_heads=16,
            num_key_value_heads=16,
            intermediate_size=4096,
            n_mamba_heads=32,
            mamba_d_state=128,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_ngroups=1,
            chunk_size=256,
            adapter_rank=128,
            use_shared_attention_adapter=True,
            use_mem_rope=True,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
        ),
        None,
    ),
    # allenai's OLMo-Hybrid 7B (transformers' OlmoHybridConfig defaults: 32 layers, 3 gated DeltaNet : 1
    # attention, DeltaNet key / value heads of 96 / 192, as many heads as the width / 128, NoPE attention,
    # 100352-token vocabulary, untied) at hidden 1024 and 16 layers (~0.45B parameters).
    "olmo-hybrid-7b-pattern-1024": (
        "OlmoHybridForCausalLM",
        dict(
            vocab_size=100352,
            hidden_size=1024,
            intermediate_size=2944,
            num_hidden_layers=16,
            layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(16)],
            num_attention_heads=8,
            num_key_value_heads=8,
            linear_num_key_heads=8,
            linear_num_value_heads=8,
            linear_key_head_dim=96,
            linear_value_head_dim=192,
            rope_parameters=None,
            max_position_embeddings=65536,
            pad_token_id=100277,
            eos_token_id=100257,
            tie_word_embeddings=False,
        ),
        olmo_hybrid_save,
    ),
}
QUANTIZE = {"f32": "none", "16": "bf16", "q8": "int8"}  # precision → blazr --quantize
HF_DTYPES = {"f32": torch.float32, "16": torch.bfloat16}


def checkpoint(name: str) -> Path:
    arch, cfg, save = MODELS[name]
    return build_hf(name, arch, cfg, save=save, bf16_over=0)


def load_hf(path: Path, dtype: torch.dtype, ids: list[int], gen: int) -> Runner:
    """transformers on `path`: greedy with its cache, the last position's logits only."""
    from transformers import AutoModelForCausalLM

    return transformers_runner(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), ids, gen)


def rows(name: str, ids: list[int], gen: int) -> list[Row]:
    hf, out = checkpoint(name), []
    for p, quantize in QUANTIZE.items():
        if p in HF_DTYPES:
            load = lambda d=HF_DTYPES[p]: load_hf(hf, d, ids, gen)
            out.append(Row("transformers", f"{name} {HF_DTYPES[p]}".replace("torch.", ""), p, load))
        load = lambda q=quantize: load_blazr(ids, gen, hf, quantize=q)
        out.append(Row("blazr", f"{name} --quantize {quantize}", p, load))
    return out


def table(measured: list[Row]) -> str:
    bases = {r.precision: r for r in measured if r.engine == "transformers"}
    lines = [
        "| engine | weights | prefill tok/s | decode tok/s | prefill × transformers "
        "| decode × transformers |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in measured:
        base = bases.get(r.precision) or bases.get("f32")
        rp = f"{r.prefill_tok_s / base.prefill_tok_s:.2f}" if base else "–"
        rd = f"{r.decode_tok_s / base.decode_tok_s:.2f}" if base else "–"
        lines.append(
            f"| {r.engine} | {r.weights} | {r.prefill_tok_s:.0f} | {r.decode_tok_s:.1f} | {rp} | {rd} |"
        )
    return "\n".join(lines)


def report(models: list[str], prompt_len: int, gen: int, rounds: int) -> str:
    """One table per model: blazr at float32 / bf16 / int8 and transformers at float32 / bf16."""
    parts = []
    for name in models:
        vocab = json.loads((checkpoint(name) / "config.json").read_text())["vocab_size"]
        ids = prompt_ids(prompt_len, min(vocab, 49152))
        t0 = time.perf_counter()
        measured = measure_single(rows(name, ids, gen), rounds, prompt_len, gen)
        log(f"# {name} done in {time.perf_counter() - t0:.0f} s")
        parts += [
            f"### {name} (random weights, scaled published shape; llama.cpp cannot load it)",
            "",
            f"Prompt {prompt_len} random tokens, {gen} greedy tokens; median of {rounds} interleaved rounds "
            "after a warm-up round. × transformers: against its row of the same precision (int8: float32).",
            "",
            table(measured),
            "",
            spread_note(measured),
            "",
        ]
    return "\n".join(parts)
