"""GGUF detection: `general.architecture` + `{arch}.*` metadata keys → the same config an HF checkpoint
would give; the tokenizer comes from the file's own vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from blazr.detect.checkpoint import Checkpoint
from blazr.detect.llama import llama_like
from blazr.detect.raw import Raw, int_or_none
from blazr.errors import UnsupportedError
from blazr.loading.gguf import GGUFFile, gguf_to_hf_name
from blazr.tokenizer import TokenizerSource


def inspect_gguf(path: Path, gguf: GGUFFile, vocab_name: str | None) -> Checkpoint:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise UnsupportedError(f"{gguf.path}: GGUF architecture {arch!r} is not supported (supported: llama)")
    shapes: dict[str, tuple[int, ...]] = {}
    for name in gguf.tensor_names:
        hf = gguf_to_hf_name(name)
        if hf is not None:
            shapes[hf] = gguf.tensor_shape(name)

    def key(k: str) -> Any:
        return meta.get(f"{arch}.{k}")

    num_heads = key("attention.head_count")
    hidden = key("embedding_length")
    rope_dim = key("rope.dimension_count")
    raw = {
        "hidden_size": hidden,
        "num_hidden_layers": key("block_count"),
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": key("attention.head_count_kv"),
        "head_dim": key("attention.key_length") or (hidden // num_heads if hidden and num_heads else None),
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base"),
        "vocab_size": key("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []) or []) or None,
    }
    scaling_type = key("rope.scaling.type")
    if scaling_type == "linear":
        raw["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    elif scaling_type == "yarn":
        raw["rope_scaling"] = {
            "rope_type": "yarn",
            "factor": key("rope.scaling.factor"),
            "original_max_position_embeddings": key("rope.scaling.original_context_length"),
        }
    if rope_dim and raw["head_dim"] and rope_dim != raw["head_dim"]:
        raw["partial_rotary_factor"] = rope_dim / raw["head_dim"]
    cfg = llama_like(Raw(raw, gguf.path), shapes, "model.", "LlamaForCausalLM")
    tok = TokenizerSource(
        vocab_name=vocab_name,
        gguf_metadata=meta,
        vocab_size=cfg.vocab_size,
        bos_token_id=int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
        add_bos_token=meta.get("tokenizer.ggml.add_bos_token"),
    )
    name = meta.get("general.name") or gguf.path.stem
    return Checkpoint(path, "gguf", (gguf.path,), cfg, tok, torch.float32, str(name), gguf)
