"""`blazr info`: a JSON description of a checkpoint computed from its detected config alone (the model is
built on the meta device to count parameters; no weights are read)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from blazr.config import dtype_name
from blazr.detect import Checkpoint
from blazr.model.model import CausalLM
from blazr.state.kv_cache import bytes_per_token, state_bytes_per_sequence
from blazr.tokenizer import vocab_for_size


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, active per token): MoE layers count only top_k of their routed experts as active."""
    total = sum(p.numel() for p in model.parameters())
    inactive = 0
    for layer in getattr(model, "layers", []):
        moe = getattr(layer, "moe", None)
        if moe is None:
            continue
        cfg = layer.cfg.moe
        routed = sum(p.numel() for p in moe.experts.parameters())
        inactive += routed * (cfg.num_experts - cfg.top_k) // cfg.num_experts
    return total, total - inactive


def _tokenizer_choice(ckpt: Checkpoint) -> dict[str, Any]:
    """Which tokenizer `load_tokenizer` will pick, in its order, without building it."""
    src = ckpt.tokenizer
    if src.vocab_name:
        source = f"--vocab {src.vocab_name}"
    elif src.tokenizer_dir is not None:
        source = str(src.tokenizer_dir / "tokenizer.json")
    elif src.gguf_metadata is not None:
        source = "gguf vocabulary"
    else:
        source = f"{vocab_for_size(src.vocab_size)} (from vocab_size {src.vocab_size})"
    return {"source": source, "eos_token_ids": list(src.eos_token_ids)}


def describe(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    cfg = ckpt.config
    with torch.device("meta"):
        model = CausalLM(cfg)
    total, active = count_parameters(model)
    config = dataclasses.asdict(cfg)
    return {
        "path": str(ckpt.path),
        "format": ckpt.format,
        "architecture": cfg.architecture,
        "weight_files": [str(p) for p in ckpt.weight_files],
        "weights_dtype": dtype_name(ckpt.weights_dtype),
        "num_layers": cfg.num_layers,
        "layer_kinds": [layer.kind for layer in cfg.layers],
        "parameters": {"total": total, "active_per_token": active},
        "cache": {
            "dtype": dtype_name(dtype),
            "kv_bytes_per_token": bytes_per_token(cfg, dtype),
            "state_bytes_per_sequence": state_bytes_per_sequence(cfg, dtype),
        },
        "tokenizer": _tokenizer_choice(ckpt),
        "config": config,
    }
