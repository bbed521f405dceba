"""Renames: blazr's internal parameter names → the tensor names of each checkpoint format.

Loading is pull-based. For every internal parameter, `unfuse` lists its logical parts (a fused qkv projection
is q, k and v; a stacked expert tensor is one slice per expert) with the shape each part must have, and a
`NameMap` (one per format/architecture) turns each logical part name into the checkpoint's tensor name,
with an optional transform (a row permutation, a folded multiplier). Every rename in blazr lives here.

Internal names: `embed_tokens.weight`, `norm.weight`, `lm_head.weight`, and per layer `layers.{i}.` +
`mixer_norm`, each mixer under its kind's prefix (`attn.{qkv_proj,o_proj}`, `mla.*`, `mamba.*`), `ffn_norm`,
`mlp.{gate_up_proj|up_proj,down_proj}`,
`moe.{router.weight, router.correction_bias, experts.{gate_up_proj|up_proj, down_proj}, shared.*}`.
Logical parts of fused ones: a mixer's as its kind declares (`MixerSpec.fused`: `attn.{q,k,v}_proj`,
`mla.kv_a_proj.{latent,rope}` and `mla.kv_b_proj.{k,v}` — oxidizr stores these separately),
`*.{gate,up}_proj`, `moe.experts.{e}.{gate,up,down}_proj`.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from blazr.config import ModelConfig
from blazr.errors import UnsupportedError
from blazr.model import mixers

Transform = Callable[[torch.Tensor], torch.Tensor]
Combine = Callable[[list[torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class RowOrder:
    """A transform that only reorders rows (dim 0): it applies to anything indexed by the weight's rows — the
    weight, and equally the addresses of its stored rows — so quantized rows are moved as stored, never
    dequantized to be permuted (loading/quantize.py). With `source_rows`, it picks some of the rows of a
    stored tensor that has that many (one part of a tensor a checkpoint stores fused: Qwen3.5's
    in_proj_qkv)."""

    reorder: Transform
    source_rows: int | None = None

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return self.reorder(t)


@dataclass(frozen=True)
class Reshaping:
    """A transform whose result has another shape than the stored tensor (transformers' GPT-OSS experts
    [E, K, N] read as [E, N, K]): `source_shape(part shape)` is the shape the stored tensor must have."""

    apply: Transform
    source_shape: Callable[[tuple[int, ...]], tuple[int, ...]]

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return self.apply(t)


@dataclass(frozen=True)
class Part:
    """One logical piece of an internal parameter and the shape it must have."""

    name: str
    shape: tuple[int, ...]


def cat_rows(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0] if len(ts) == 1 else torch.cat(ts, dim=0)


_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def _stack_pairs(num_experts: int) -> Combine:
    """[gate_0, up_0, gate_1, up_1, …] → [E, 2I, D] with gate rows first in each expert."""

    def combine(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.cat(ts[2 * e : 2 * e + 2], dim=0) for e in range(num_experts)])

    return combine


def _stack(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(ts)


def _interleave_heads(num_heads: int) -> Combine:
    """[part 0 rows of all heads, part 1 rows of all heads, …] → per head [part0_h; part1_h; …] (e.g. MLA
    kv_b_proj, per head [k_h; v_h])."""

    def combine(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.unflatten(0, (num_heads, -1)) for t in ts], dim=1).flatten(0, 1)

    return combine


def unfuse(cfg: ModelConfig, name: str, shape: tuple[int, ...]) -> tuple[list[Part], Combine]:
    """Split an internal parameter into the logical parts a checkpoint may store separately.

    The loader first looks for the whole parameter under its mapped name (a checkpoint that stores it fused,
    e.g. Granite's 3-D experts) and only then for these parts."""
    m = _LAYER.fullmatch(name)
    if m is None:
        return [Part(name, shape)], cat_rows
    i, rest = int(m.group(1)), m.group(2)
    p = f"layers.{i}."
    kind = rest.rsplit(".", 1)[-1]
    tail = shape[1:]
    prefix, _, leaf = rest.partition(".")
    if (mixer := mixers.mixer_at(cfg.layers[i], prefix)) is not None:
        spec, mixer_cfg = mixer
        fused = spec.fused(mixer_cfg, leaf)
        if fused is None:
            return [Part(name, shape)], cat_rows
        parts = [Part(f"{p}{prefix}.{part}", (rows, *tail)) for part, rows in fused.parts]
        return parts, _interleave_heads(fused.num_heads) if fused.num_heads else cat_rows
    if rest == "moe.experts.gate_up_proj":
        E, two_i, D = shape
        parts = [
            Part(f"{p}moe.experts.{e}.{x}_proj.weight", (two_i // 2, D))
            for e in range(E)
            for x in ("gate", "up")
        ]
        return parts, _stack_pairs(E)
    if rest in ("moe.experts.up_proj", "moe.experts.down_proj"):
        x = rest.rsplit(".", 1)[1]
        return [Part(f"{p}moe.experts.{e}.{x}.weight", tail) for e in range(shape[0])], _stack
    if rest.endswith(".gate_up_proj.weight") or rest.endswith(".gate_up_proj.bias"):
        module = rest[: -len(".gate_up_proj.") - len(kind)]
        half = shape[0] // 2
        return [Part(f"{p}{module}.{x}_proj.{kind}", (half, *tail)) for x in ("gate", "up")], cat_rows
    return [Part(name, shape)], cat_rows


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    template: str
    transform: Callable[[re.Match[str]], Transform | None] | None = None
    only_if: Callable[[re.Match[str]], bool] | None = None
    # other names the checkpoint may hold the tensor under, tried in order when `template`'s is absent
    alternatives: tuple[str, ...] = ()


@dataclass
class NameMap:
    """Ordered regex rules from logical part names to checkpoint names; the first rule that matches in
    full (and whose `only_if` accepts the match) wins. `transform(match)` may return a function applied to
    the loaded tensor (a row permutation, a folded multiplier). Tensors under `ignored_prefixes` are left
    unread without a warning."""

    rules: list[Rule] = field(default_factory=list)
    # checkpoint tensors blazr leaves unread on purpose (a multimodal checkpoint's vision tower): not reported
    ignored_prefixes: tuple[str, ...] = ()
    # the checkpoint's tensor names, where known: a rule's `alternatives` are picked against them
    available: frozenset[str] = frozenset()

    def ignore(self, *prefixes: str) -> NameMap:
        self.ignored_prefixes += prefixes
        return self

    def add(
        self,
        pattern: str,
        template: str,
        transform: Callable[[re.Match[str]], Transform | None] | None = None,
        only_if: Callable[[re.Match[str]], bool] | None = None,
        alternatives: tuple[str, ...] = (),
    ) -> NameMap:
        self.rules.append(Rule(re.compile(pattern), template, transform, only_if, alternatives))
        return self

    def source(self, part: str) -> tuple[str, Transform | None] | None:
        for rule in self.rules:
            m = rule.pattern.fullmatch(part)
            if m is not None and (rule.only_if is None or rule.only_if(m)):
                name = m.expand(rule.template)
                if name not in self.available:
                    name = next((n for a in rule.alternatives if (n := m.expand(a)) in self.available), name)
                return name, (rule.transform(m) if rule.transform else None)
        return None


NameMapBuilder = Callable[[ModelConfig], NameMap]


def _collect() -> dict[str, NameMapBuilder]:
    """Each family module of this package contributes `NAME_MAPS` (architecture → builder)."""
    maps: dict[str, NameMapBuilder] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        maps.update(getattr(module, "NAME_MAPS", {}))
    return maps


def name_map_for(fmt: str, cfg: ModelConfig, available: set[str] | frozenset[str] = frozenset()) -> NameMap:
    """The renames of a checkpoint format / architecture (GGUF tensors arrive under their HF names);
    `available`: the checkpoint's tensor names, against which rules with alternatives pick theirs."""
    maps = _collect()
    key = "oxidizr" if fmt == "oxidizr" else cfg.architecture
    if key not in maps:
        raise UnsupportedError(f"no tensor-name map for architecture {key}")
    names = maps[key](cfg)
    names.available = frozenset(available)
    return names
