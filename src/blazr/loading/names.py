"""Renames: blazr's internal parameter names → the tensor names of each checkpoint format.

Loading is pull-based. For every internal parameter, `unfuse` lists its logical parts (a fused qkv projection
is q, k and v; a stacked expert tensor is one slice per expert) with the shape each part must have, and a
`NameMap` (one per format/architecture) turns each logical part name into the checkpoint's tensor name,
with an optional transform (a row permutation, a folded multiplier). Every rename in blazr lives here.

Internal names: `embed_tokens.weight`, `norm.weight`, `lm_head.weight`, and per layer `layers.{i}.` +
`mixer_norm`, `attn.{qkv_proj,o_proj}`, `ffn_norm`, `mlp.{gate_up_proj|up_proj,down_proj}`.
Logical part names replace fused ones: `attn.{q,k,v}_proj`, `mlp.{gate,up}_proj`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from blazr.config import ModelConfig

Transform = Callable[[torch.Tensor], torch.Tensor]
Combine = Callable[[list[torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Part:
    """One logical piece of an internal parameter and the shape it must have."""

    name: str
    shape: tuple[int, ...]


def _cat0(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0] if len(ts) == 1 else torch.cat(ts, dim=0)


_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def unfuse(cfg: ModelConfig, name: str, shape: tuple[int, ...]) -> tuple[list[Part], Combine]:
    """Split an internal parameter into the logical parts a checkpoint stores separately."""
    m = _LAYER.fullmatch(name)
    if m is None:
        return [Part(name, shape)], _cat0
    i, rest = int(m.group(1)), m.group(2)
    prefix = f"layers.{i}."
    layer = cfg.layers[i]
    if rest.startswith("attn.qkv_proj.") and layer.attention is not None:
        a, kind = layer.attention, rest.rsplit(".", 1)[1]
        q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        tail = shape[1:]
        parts = [
            Part(f"{prefix}attn.{p}_proj.{kind}", (n, *tail)) for p, n in (("q", q), ("k", kv), ("v", kv))
        ]
        return parts, _cat0
    if rest.startswith("mlp.gate_up_proj."):
        kind, half = rest.rsplit(".", 1)[1], shape[0] // 2
        parts = [Part(f"{prefix}mlp.{p}_proj.{kind}", (half, *shape[1:])) for p in ("gate", "up")]
        return parts, _cat0
    return [Part(name, shape)], _cat0


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    template: str
    transform: Callable[[re.Match[str]], Transform | None] | None = None


@dataclass
class NameMap:
    """Ordered regex rules from logical part names to checkpoint names; first full match wins."""

    rules: list[Rule] = field(default_factory=list)

    def add(
        self,
        pattern: str,
        template: str,
        transform: Callable[[re.Match[str]], Transform | None] | None = None,
    ) -> NameMap:
        self.rules.append(Rule(re.compile(pattern), template, transform))
        return self

    def source(self, part: str) -> tuple[str, Transform | None] | None:
        for rule in self.rules:
            m = rule.pattern.fullmatch(part)
            if m is not None:
                return m.expand(rule.template), (rule.transform(m) if rule.transform else None)
        return None


def llama_names(prefix: str = "model.") -> NameMap:
    """HF Llama / Qwen2 / Mistral names (also GGUF llama, whose names are first mapped to HF ones)."""
    return (
        NameMap()
        .add(r"embed_tokens\.weight", prefix + "embed_tokens.weight")
        .add(r"norm\.weight", prefix + "norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(r"layers\.(\d+)\.mixer_norm\.weight", prefix + r"layers.\1.input_layernorm.weight")
        .add(r"layers\.(\d+)\.ffn_norm\.weight", prefix + r"layers.\1.post_attention_layernorm.weight")
        .add(r"layers\.(\d+)\.attn\.(.+)", prefix + r"layers.\1.self_attn.\2")
        .add(r"layers\.(\d+)\.mlp\.(.+)", prefix + r"layers.\1.mlp.\2")
    )


def oxidizr_names() -> NameMap:
    """oxidizr trainer names (spec §3): the Llama names without the `model.` prefix."""
    return llama_names(prefix="")


def name_map_for(fmt: str, architecture: str) -> NameMap:
    if fmt == "oxidizr":
        return oxidizr_names()
    return llama_names()
