"""Helpers that write tiny GGUF files for tests, using the `gguf` package's own writer and quantizers.

Nothing here imports blazr: names come from gguf's `TensorNameMap`, the q/k permutation is llama.cpp's
converter's, and values are encoded by `gguf.quants.quantize`, so files built here are an independent
reference for `blazr.loading.gguf`.

Arrays are in torch order (`[out, in]` for matrices); encoded bytes are `[rows, bytes per row]` uint8.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# Byte offsets of the fp16 scale/min fields inside one block (ggml's block_* structs).
F16_FIELD_OFFSETS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
F32_FIELD_OFFSETS: dict[str, tuple[int, ...]] = {"Q8_K": (0,)}


def type_sizes(qtype: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a ggml type name."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]


def encode(values: np.ndarray, qtype: str) -> np.ndarray:
    """Float values [..., C] → ggml bytes [..., C / block * type size] (uint8) via gguf's quantizers."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == "F32":
        data = values
    elif qtype == "F16":
        data = values.astype(np.float16)
    else:
        data = gguf.quants.quantize(values, GGMLQuantizationType[qtype])
    return np.ascontiguousarray(data).view(np.uint8).reshape(*values.shape[:-1], -1)


def random_blocks(qtype: str, num_values: int, seed: int = 0) -> np.ndarray:
    """Deterministic random bytes [num_blocks, type size] for `num_values` values of any block type.

    Quant bits are uniform random; scale fields are finite (uniform fp16/fp32 in ±0.05, some exact zeros,
    some tiny subnormal-range values) so dequantized values are finite. F32/F16/BF16 are random normals.
    """
    rng = np.random.default_rng(seed)
    block_size, type_size = type_sizes(qtype)
    num_blocks = num_values // block_size
    assert num_blocks * block_size == num_values, (qtype, num_values)
    if qtype in ("F32", "F16", "BF16"):
        values = rng.standard_normal(num_values).astype(np.float32)
        if qtype == "BF16":
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(num_blocks, -1)
        return encode(values, qtype).reshape(num_blocks, -1)
    blocks = rng.integers(0, 256, size=(num_blocks, type_size), dtype=np.uint8)
    for offsets, dtype, nbytes in ((F16_FIELD_OFFSETS, np.float16, 2), (F32_FIELD_OFFSETS, np.float32, 4)):
        for offset in offsets.get(qtype, ()):
            scale = rng.uniform(-0.05, 0.05, size=num_blocks)
            scale[rng.random(num_blocks) < 0.05] = 0.0
            scale[rng.random(num_blocks) < 0.05] *= 1e-4  # tiny: fp16 subnormals
            blocks[:, offset : offset + nbytes] = (
                scale.astype(dtype).view(np.uint8).reshape(num_blocks, nbytes)
            )
    if qtype == "MXFP4":  # the e8m0 scale byte: 2^(e − 127) around 1, finite
        blocks[:, 0] = rng.integers(110, 140, size=num_blocks, dtype=np.uint8)
    return blocks


def permute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py): HF half-split rows → interleaved pairs."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_to_gguf_name(hf_name: str, num_layers: int) -> str:
    """The GGUF name of an HF llama parameter, from gguf's own `TensorNameMap`."""
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, num_layers)
    gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    assert gguf_name is not None, hf_name
    return gguf_name


def _add_kv(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int) and 0 <= value < 2**32:
        writer.add_uint32(key, value)
    elif isinstance(value, int):
        writer.add_int64(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def write_gguf(
    path: str | Path,
    tensors: Mapping[str, tuple[np.ndarray, str]],
    metadata: Mapping[str, Any] | None = None,
    arch: str = "llama",
) -> Path:
    """Write `tensors` (GGUF name → (array, ggml type)) and `metadata` (key → bool/int/float/str/list).

    A float array is encoded to its type here; a uint8 array is taken as already-encoded bytes
    [..., bytes per row]. ints are written as uint32 (as llama.cpp does for sizes), floats as float32.
    """
    path = Path(path)
    writer = gguf.GGUFWriter(path, arch)
    for key, value in (metadata or {}).items():
        _add_kv(writer, key, value)
    for name, (array, qtype) in tensors.items():
        data = array if array.dtype == np.uint8 else encode(array, qtype)
        writer.add_tensor(name, np.ascontiguousarray(data), raw_dtype=GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _config_dict(config: Any) -> dict[str, Any]:
    return dict(config) if isinstance(config, Mapping) else config.to_dict()


def llama_metadata(config: Any, vocab: Sequence[str] | None = None) -> dict[str, Any]:
    """The llama.* (and optional tokenizer.ggml.*) keys llama.cpp's converter writes for an HF config."""
    cfg = _config_dict(config)
    num_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
    metadata: dict[str, Any] = {
        "general.name": "tiny-llama",
        "llama.block_count": cfg["num_hidden_layers"],
        "llama.context_length": cfg.get("max_position_embeddings", 2048),
        "llama.embedding_length": cfg["hidden_size"],
        "llama.feed_forward_length": cfg["intermediate_size"],
        "llama.attention.head_count": num_heads,
        "llama.attention.head_count_kv": cfg.get("num_key_value_heads") or num_heads,
        "llama.rope.freq_base": float(cfg.get("rope_theta", 10000.0)),
        "llama.attention.layer_norm_rms_epsilon": float(cfg.get("rms_norm_eps", 1e-5)),
        "llama.rope.dimension_count": head_dim,
        "llama.vocab_size": cfg["vocab_size"],
    }
    if vocab is not None:
        metadata |= {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": list(vocab),
            "tokenizer.ggml.token_type": [1] * len(vocab),
            "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": min(1, len(vocab) - 1),
        }
    return metadata


def write_random_block_llama_gguf(
    path: str | Path, hf_state_dict: Mapping[str, Any], config: Mapping[str, Any], qtype: str
) -> Path:
    """A llama GGUF whose matrices are random `qtype` blocks (`random_blocks`, one seed a tensor: gguf's
    Python has no K-quant encoder) in the shapes of `hf_state_dict`, tensors in its order (sort it by GGUF
    name for the converter's order); 1-D tensors as F32 values."""
    layers = config["num_hidden_layers"]
    tensors = {
        hf_to_gguf_name(hf, layers): (random_blocks(qtype, v.numel(), i).reshape(v.shape[0], -1), qtype)
        if v.dim() == 2 else (v.numpy(), "F32")
        for i, (hf, v) in enumerate(hf_state_dict.items())
    }  # fmt: skip
    return write_gguf(path, tensors, llama_metadata(config))


def write_tiny_llama_gguf(
    path: str | Path,
    hf_state_dict: Mapping[str, Any],
    config: Any,
    qtype: str = "F32",
    vocab: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write an HF llama state dict as llama.cpp's converter would: GGUF names, q/k rows permuted.

    `config` is an HF config (or its dict); `hf_state_dict` holds torch tensors or arrays. Matrices are
    encoded as `qtype` (F32, F16, or any type `gguf.quants.quantize` supports); 1-D tensors (norms,
    biases) stay F32 as in llama.cpp. Pass `vocab` to add a minimal gpt2-style token list, `metadata`
    for more keys (`llama.pooling_type`, say).
    """
    cfg = _config_dict(config)
    num_heads = cfg["num_attention_heads"]
    num_kv_heads = cfg.get("num_key_value_heads") or num_heads
    tensors: dict[str, tuple[np.ndarray, str]] = {}
    for hf_name, value in hf_state_dict.items():
        array = value.detach().float().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        array = array.astype(np.float32)
        if ".q_proj." in hf_name:
            array = permute_qk(array, num_heads)
        elif ".k_proj." in hf_name:
            array = permute_qk(array, num_kv_heads)
        tensors[hf_to_gguf_name(hf_name, cfg["num_hidden_layers"])] = (
            array,
            qtype if array.ndim >= 2 else "F32",
        )
    return write_gguf(path, tensors, {**llama_metadata(cfg, vocab), **(metadata or {})})
