"""GGUF detection: `general.architecture` + `{arch}.*` metadata keys → the config.json keys of the HF model
llama.cpp's converter read, then that HF architecture's own builder over the file's tensors seen under HF
names and shapes (loading/gguf_hf.py). The tokenizer comes from the file's own vocabulary.

Each family's keys are read where its kind lives: the attention-only families, dense and MoE (llama, qwen2 /
qwen3 / qwen3moe, olmo2, smollm3, phi3, gemma2 / 3 / 4, granite / granitemoe, deepseek2, glm4moe, gpt-oss),
in detect/gguf_attention.py, with the values llama.cpp stores as tensors (LongRoPE's factors, Gemma 4's
rope); the state-space and linear-attention families and hybrids (mamba2, granitehybrid, nemotron_h,
falcon-h1, qwen3next / qwen35, kimi-linear, lfm2, mamba, jamba) in detect/gguf_hybrid.py. Here: the keys
every family shares (hidden size, layers, context, vocabulary, tied embeddings), the per-layer head counts
the HF-name view needs, and the builder's run.

In: the GGUF's path, its `GGUFFile` and the vocabulary name asked for. Out: a `Checkpoint` (config,
tokenizer source, the file), or a `CheckpointError` / `UnsupportedError`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blazr.detect import gguf_attention, gguf_hybrid
from blazr.detect.checkpoint import Checkpoint
from blazr.detect.gguf_attention import Meta, per_layer
from blazr.detect.raw import Raw, int_or_none
from blazr.loading.gguf import GGUFFile
from blazr.loading.gguf_hf import GGUFView
from blazr.tokenizer import TokenizerSource

# llama.cpp architecture → its metadata as the HF config keys (every name loading/gguf_hf.ARCHES knows)
_CONFIG_KEYS: dict[str, Callable[[Meta, int], dict[str, Any]]] = {
    **gguf_attention.CONFIG_KEYS,
    **gguf_hybrid.CONFIG_KEYS,
}
# config values llama.cpp stores as tensors, read from the file (architecture → its reader)
_TENSOR_KEYS: dict[str, Callable[[GGUFFile, Meta], dict[str, Any]]] = gguf_attention.TENSOR_KEYS


def inspect_gguf(path: Path, gguf: GGUFFile, vocab_name: str | None) -> Checkpoint:
    from blazr.detect import BUILDERS  # the HF builders (this module is imported by blazr.detect)

    meta = gguf.metadata
    arch = str(meta.get("general.architecture"))

    def key(k: str) -> Any:
        value = meta.get(f"{arch}.{k}")
        # GGUF floats are float32: the shortest decimal that is the same float32 gives back config.json's
        # number (1e-05, not 9.999999747378752e-06)
        return float(str(np.float32(value))) if isinstance(value, float) else value

    num_layers = int(key("block_count") or 0)
    heads, kv = key("attention.head_count"), key("attention.head_count_kv")
    q_heads = per_layer(heads, num_layers)
    kv_heads = per_layer(heads if kv is None else kv, num_layers)
    view = GGUFView(gguf, q_heads, kv_heads)  # rejects an architecture it cannot name
    shapes = {n: view.shape(n) for n in view.names}
    specific = _CONFIG_KEYS[arch](key, num_layers)
    if arch in _TENSOR_KEYS:
        specific.update(_TENSOR_KEYS[arch](gguf, key))
    context = key("context_length")
    raw: dict[str, Any] = {
        "architectures": [view.hf_architecture],
        "hidden_size": key("embedding_length"),
        "num_hidden_layers": num_layers,
        "max_position_embeddings": context if context and context < 1 << 20 else None,  # 2^20: "unset"
        "vocab_size": key("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []) or []) or None,
        "tie_word_embeddings": "output.weight" not in gguf.tensor_names,
        **specific,
    }
    raw = {k: v for k, v in raw.items() if v is not None}
    hf_arch = raw["architectures"][0]
    cfg = BUILDERS[hf_arch](Raw(raw, gguf.path), shapes)
    tok = TokenizerSource(
        vocab_name=vocab_name,
        gguf_metadata=meta,
        vocab_size=cfg.vocab_size,
        bos_token_id=int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
        add_bos_token=meta.get("tokenizer.ggml.add_bos_token"),
    )
    name = meta.get("general.name") or gguf.path.stem
    return Checkpoint(path, "gguf", gguf.paths, cfg, tok, torch.float32, str(name), gguf)
