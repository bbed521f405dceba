"""`blazr info`: a JSON description of a checkpoint computed from its detected config alone (the model is
built on the meta device to count parameters; no weights are read), with the cache memory budget the
engine would size its pools from on this machine now (state/budget.py), what it holds, whether the prefix
cache is on, the plan line the load log prints (with the recurrent-state snapshot pool, for hybrids), and
per KV group (full attention, each sliding window: state/layout.py) its layers and the budget its pool
takes."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from blazr.config import EngineConfig, dtype_name
from blazr.detect import Checkpoint
from blazr.errors import BlazrError
from blazr.model.mixers import cache_layout
from blazr.model.skeleton import skeleton
from blazr.state.budget import DEFAULT_FRACTION, cache_budget, group_name, plan_cache
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


def _budget(ckpt: Checkpoint, dtype: torch.dtype, engine: EngineConfig) -> dict[str, Any]:
    """The cache budget and what fits in it at `engine`'s limits."""
    layout = cache_layout(ckpt.config)
    budget = cache_budget(engine)
    per_token = layout.bytes_per_token(dtype)
    state = layout.state_bytes_per_sequence(dtype)
    room = max(0, budget - engine.max_num_seqs * state)
    return {
        "memory_gib": round(budget / 2**30, 3),
        "source": "--cache-memory"
        if engine.cache_memory_gib is not None
        else f"{DEFAULT_FRACTION:g} of available",
        "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "tokens": room // per_token if per_token else None,
        "full_length_sequences": room // (per_token * engine.max_model_len) if per_token else None,
    }


def _plan(ckpt: Checkpoint, dtype: torch.dtype, engine: EngineConfig) -> str:
    """The pools the engine would allocate, as the load log says it, or why it could not."""
    try:
        return plan_cache(cache_layout(ckpt.config), engine, dtype).describe()
    except BlazrError as e:
        return f"error: {e}"


def _groups(ckpt: Checkpoint, dtype: torch.dtype, engine: EngineConfig) -> list[dict[str, Any]]:
    """Each KV group: its kind ("full" / "sliding-W"), layers with a pool of their own, bytes per token slot,
    and — where the plan fits — the blocks, token slots and GiB its pool would take."""
    layout = cache_layout(ckpt.config)
    if not layout.has_paged:
        return []
    try:
        plan = plan_cache(layout, engine, dtype)
    except BlazrError:
        plan = None
    groups = []
    per_token, num_layers = layout.group_bytes_per_token(dtype), layout.group_num_layers()
    for g, window in enumerate(layout.windows):
        group: dict[str, Any] = {
            "kind": group_name(window),
            "window": window,
            "layers": num_layers[g],
            "kv_bytes_per_token": per_token[g],
        }
        if plan is not None:
            group |= {
                "blocks": plan.group_blocks[g],
                "tokens": plan.group_blocks[g] * plan.block_size,
                "memory_gib": round(plan.group_bytes[g] / 2**30, 4),
            }
        groups.append(group)
    return groups


def describe(
    ckpt: Checkpoint, dtype: torch.dtype = torch.float32, engine: EngineConfig | None = None
) -> dict[str, Any]:
    """The JSON of `blazr info`; `engine` gives the limits the cache budget is reported for (default: the
    LLM's defaults for this checkpoint)."""
    cfg = ckpt.config
    if engine is None:
        engine = EngineConfig(max_model_len=min(cfg.max_position_embeddings, 4096))
    model = skeleton(cfg)
    total, active = count_parameters(model)
    layout = cache_layout(cfg)
    config = dataclasses.asdict(cfg)
    for layer, fields in zip(cfg.layers, config["layers"], strict=True):  # each mixer config with its kind
        fields["mixers"] = [{"kind": m.kind, **dataclasses.asdict(m)} for m in layer.mixers]
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
            "kv_bytes_per_token": layout.bytes_per_token(dtype),
            "state_bytes_per_sequence": layout.state_bytes_per_sequence(dtype),
            "prefix_caching": engine.enable_prefix_caching,
            "budget": _budget(ckpt, dtype, engine),
            "plan": _plan(ckpt, dtype, engine),
            "groups": _groups(ckpt, dtype, engine),
        },
        "tokenizer": _tokenizer_choice(ckpt),
        "config": config,
    }
