"""`blazr info`: a JSON description of a checkpoint computed from its detected config alone (the model is
built on the meta device to count parameters; no weights are read)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from blazr.detect import Checkpoint
from blazr.model.model import CausalLM
from blazr.state.kv_cache import bytes_per_token, state_bytes_per_sequence


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


def describe(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    cfg = ckpt.config
    with torch.device("meta"):
        model = CausalLM(cfg)
    total, active = count_parameters(model)
    layers = []
    for i, layer in enumerate(cfg.layers):
        entry: dict[str, Any] = {"index": i, "kind": layer.kind}
        layers.append(entry)
    config = dataclasses.asdict(cfg)
    return {
        "path": str(ckpt.path),
        "format": ckpt.format,
        "architecture": cfg.architecture,
        "weight_files": [str(p) for p in ckpt.weight_files],
        "weights_dtype": str(ckpt.weights_dtype).removeprefix("torch."),
        "num_layers": cfg.num_layers,
        "layer_kinds": [entry["kind"] for entry in layers],
        "parameters": {"total": total, "active_per_token": active},
        "cache": {
            "dtype": str(dtype).removeprefix("torch."),
            "kv_bytes_per_token": bytes_per_token(cfg, dtype),
            "state_bytes_per_sequence": state_bytes_per_sequence(cfg, dtype),
        },
        "tokenizer": {
            "vocab": ckpt.tokenizer.vocab_name,
            "tokenizer_json": str(ckpt.tokenizer.tokenizer_dir) if ckpt.tokenizer.tokenizer_dir else None,
            "gguf_vocab": ckpt.tokenizer.gguf_metadata is not None,
            "eos_token_ids": list(ckpt.tokenizer.eos_token_ids),
        },
        "config": config,
    }
