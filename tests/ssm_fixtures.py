"""Shared pieces of the HF hybrid state-space parity tests (Mamba2, GraniteMoeHybrid, Bamba, NemotronH,
FalconH1): tiny transformers checkpoints with the parameters transformers initialises to constants made
random, one loaded (HF model, blazr LLM) pair per variant, checkpoints re-detected with an edited or missing
config.json, and the Mamba2 state-bytes formula computed from the HF config.

Shapes: H Mamba2 heads, P head dim, N state, G groups, K conv kernel, Di = H·P.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from blazr import LLM
from blazr.config import LayerConfig, ModelConfig
from blazr.detect import inspect_checkpoint
from blazr.info import describe
from tests.drive import assert_logits_close, full_logits
from tests.hf_parity import prompts
from tests.threads import intra_op_threads
from tests.tiny import build

# GQA with head_dim 64 (2 query heads, 1 KV head at hidden 128): the head size detection assumes when
# config.json is missing, so the no-config checkpoints run the same attention.
HEADS = dict(num_attention_heads=2, num_key_value_heads=1)


def single_thread() -> Iterator[None]:
    """For a module-scoped fixture: run on one intra-op thread, then restore. Tiny models gain nothing from
    more, and on a shared 2-vCPU machine OpenMP spin-waiting made transformers' decode 20× slower."""
    with intra_op_threads(1):
        yield


@dataclasses.dataclass
class Pair:
    """A tiny HF model, the blazr LLM loaded from its saved checkpoint, and where that lies."""

    hf: nn.Module
    llm: LLM
    path: Path
    name: str = ""


@torch.no_grad()
def randomise(model: nn.Module, seed: int) -> None:
    """Give random values to what transformers initialises to constants (A_log, D, dt_bias, norm weights —
    around 1, or around 0 for the (1 + w) norms initialised to zeros —, biases, the NemotronH correction
    bias), so that a swapped or dropped tensor changes the logits."""
    g = torch.Generator().manual_seed(seed)

    def rand(t: torch.Tensor) -> torch.Tensor:
        return torch.rand(t.shape, generator=g)

    def randn(t: torch.Tensor) -> torch.Tensor:
        return torch.randn(t.shape, generator=g)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.copy_(torch.log(1 + 7 * rand(p)))  # A in [-8, -1]
        elif leaf == "dt_bias":
            p.copy_(3 * rand(p) - 2)  # dt well above NemotronH's dt_min, which HF's decode step ignores
        elif leaf == "D":
            p.copy_(randn(p))
        elif leaf == "bias" and "conv1d" not in name:
            p.copy_(0.1 * randn(p))
        elif (
            leaf == "weight" and p.dim() == 1
        ):  # every norm; a zero-centred one's scale is 1 + w (Qwen3-Next)
            p.copy_((0 if bool((p == 0).all()) else 1) + 0.2 * randn(p))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.05 * randn(b))


def load_pair(root: Path, name: str, arch: str, seed: int = 0, **overrides: Any) -> Pair:
    """Build the HF model (random constants), save it under `root`, and load it with blazr (float32)."""
    hf = build(arch, root, seed=seed, **overrides)
    randomise(hf, seed + 1)
    hf.save_pretrained(root)
    return Pair(hf, LLM(root, cpu=True, dtype="float32", max_num_seqs=8), root, name)


def detect_with(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None] | None) -> ModelConfig:
    """Copy the checkpoint at `src` to `dst` with config.json edited in place by `edit` (None: no
    config.json at all) and detect it."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.safetensors"):
        shutil.copy(f, dst / f.name)
    if edit is not None:
        raw = json.loads((src / "config.json").read_text())
        edit(raw)
        (dst / "config.json").write_text(json.dumps(raw))
    return inspect_checkpoint(dst).config


def map_layers(cfg: ModelConfig, **fns: Callable[[Any], Any]) -> ModelConfig:
    """Apply `fns[name](sub_config)` to every layer's mixer of that kind (mamba2, attention, …) and its
    feed-forward of that field (mlp, moe), where it has one."""

    def mapped(layer: LayerConfig) -> LayerConfig:
        mixers = tuple(fns[m.kind](m) if m.kind in fns else m for m in layer.mixers)
        ffn = {k: fns[k](getattr(layer, k)) for k in ("mlp", "moe") if k in fns and getattr(layer, k)}
        return dataclasses.replace(layer, mixers=mixers, **ffn)

    return dataclasses.replace(cfg, layers=tuple(mapped(layer) for layer in cfg.layers))


def runtime_free(cfg: ModelConfig) -> ModelConfig:
    """Drop what neither a shape carries nor changes the math: the SSD chunk size and the context limit."""
    cfg = map_layers(cfg, mamba2=lambda m: dataclasses.replace(m, chunk_size=0))
    return dataclasses.replace(cfg, max_position_embeddings=0)


def check_without_config_json(
    pair: Pair, dst: Path, expected: Callable[[ModelConfig], ModelConfig] = lambda c: c
) -> None:
    """With no config.json, detection infers `expected(config with config.json)` up to runtime-only fields;
    where nothing needed to be adjusted, the inferred model gives the original's logits (the SSD chunk size,
    which no shape carries, changes only the summation order)."""
    inferred = detect_with(pair.path, dst, None)
    want = expected(pair.llm.config)
    assert runtime_free(inferred) == runtime_free(want)
    if runtime_free(want) == runtime_free(pair.llm.config):
        batch = prompts([13], seed=7, vocab=pair.llm.config.vocab_size)
        other = LLM(dst, cpu=True, dtype="float32", max_num_seqs=2)
        assert_logits_close(full_logits(other.runner, batch)[0], full_logits(pair.llm.runner, batch)[0], 1e-5)


def mamba_state_bytes(H: int, P: int, N: int, G: int, K: int, num_layers: int, dtype_bytes: int) -> int:
    """conv: conv_dim × (K−1) × dtype bytes + SSM: H × P × N × 4 (float32), per Mamba2 layer."""
    conv_dim = H * P + 2 * G * N
    return num_layers * (conv_dim * (K - 1) * dtype_bytes + H * P * N * 4)


def check_state_bytes(pair: Pair, H: int, P: int, N: int, G: int, K: int, num_layers: int) -> None:
    """`blazr info` reports the formula's Mamba2 state bytes per sequence, and the cache the engine
    allocated holds exactly that much per state slot."""
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        info = describe(pair.llm.checkpoint, dtype)
        assert info["cache"]["state_bytes_per_sequence"] == mamba_state_bytes(H, P, N, G, K, num_layers, size)
    cache = pair.llm.runner.cache
    per_slot = sum(t[0].numel() * t.element_size() for t in cache.state)
    assert per_slot == mamba_state_bytes(H, P, N, G, K, num_layers, 4)


def layer_kinds(cfg: ModelConfig) -> list[str]:
    return [layer.kind for layer in cfg.layers]
