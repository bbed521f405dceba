"""The registry of mixer kinds — attention, MLA, Mamba2, gated DeltaNet — and the lookups every consumer goes
through instead of naming kinds: a layer's mixer modules (`build`), the model's cache (`cache_layout`), the
quantizable linears (`quantizable_linears`), a parameter's kind (`mixer_at`: names, tensor parallel), and
each config's spec (`spec_of`: plan and graph eligibility).

Adding a kind: its config (config.py), its module with its `SPEC` (model/mixer_spec.py says what to
declare) and one entry in `_KINDS` below; then its kernels, its detection (detect/) and its names
(loading/names/). `register` refuses a mistyped or clashing spec, and a config of a kind not registered is
refused by every consumer (`spec_of`); tests/test_mixers.py checks each consumer against each kind.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from torch import nn

from blazr.config import LayerConfig, MixerConfig, ModelConfig
from blazr.errors import UnsupportedError
from blazr.model import attention, deltanet, kda, mamba1, mamba2, mla, short_conv, zamba2_shared
from blazr.model.mixer_spec import MixerSpec, RopeFor
from blazr.state.layout import CacheLayout, CacheTensor, LayerLayout, Snapshot, group_windows

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup

_SPECS: dict[type[MixerConfig], MixerSpec] = {}
# a Block's own parts: no kind may take their names
_RESERVED = (
    "mixer_norm",
    "ffn_norm",
    "mixer_post_norm",
    "ffn_post_norm",
    "mlp",
    "moe",
    "per_layer",
    "out_scale",
)
_CALLABLES = ("build", "cache", "fused", "shard", "slice")


def register(spec: MixerSpec) -> MixerSpec:
    """Add a kind; ValueError naming every declaration that is mistyped or taken by another kind (one left
    out cannot be written: MixerSpec has no defaults)."""
    found = _problems(spec)
    if found:
        raise ValueError(f"mixer kind {getattr(spec.config, 'kind', spec.config)!r}: {'; '.join(found)}")
    _SPECS[spec.config] = spec
    return spec


def _problems(spec: MixerSpec) -> list[str]:
    config, taken = spec.config, _SPECS.values()
    if not (isinstance(config, type) and issubclass(config, MixerConfig)):
        return ["config: not a MixerConfig class"]
    found = []
    if not isinstance(config.__dict__.get("kind"), str) or not config.kind:
        found.append("config: declares no `kind` of its own")
    elif config.kind in {s.kind for s in taken}:
        found.append("kind: registered already")
    names = {*_RESERVED, *(s.prefix for s in taken)}
    if not isinstance(spec.prefix, str) or not spec.prefix.isidentifier() or spec.prefix in names:
        found.append(f"prefix {spec.prefix!r}: not a free name")
    found += [f"{name}: not callable" for name in _CALLABLES if not callable(getattr(spec, name))]
    if spec.graph_windows is not None and not callable(spec.graph_windows):
        found.append("graph_windows: neither None nor callable")
    for name in ("linears", "float_linears"):
        leaves = getattr(spec, name)
        if not (isinstance(leaves, tuple) and all(isinstance(x, str) for x in leaves)):
            found.append(f"{name}: not a tuple of names")
    if not isinstance(spec.snapshot, Snapshot):
        found.append("snapshot: not a Snapshot")
    for flag in ("is_plan_safe", "chains_rows"):
        if not isinstance(getattr(spec, flag), bool):
            found.append(f"{flag}: not a bool")
    if not found and set(spec.linears) & set(spec.float_linears):
        found.append("linears and float_linears overlap")
    return found


def specs() -> tuple[MixerSpec, ...]:
    """Every registered kind, in registration order."""
    return tuple(_SPECS.values())


def spec_of(cfg: MixerConfig) -> MixerSpec:
    """The spec of a mixer config's kind (UnsupportedError for a kind nobody registered)."""
    spec = _SPECS.get(type(cfg))
    if spec is None:
        kinds = ", ".join(s.kind for s in _SPECS.values())
        raise UnsupportedError(f"mixer {type(cfg).__name__} is no registered kind (model/mixers.py: {kinds})")
    return spec


def mixer_at(layer: LayerConfig, prefix: str) -> tuple[MixerSpec, MixerConfig] | None:
    """The spec and config of `layer`'s mixer whose parameters are named `{prefix}.…`, or None."""
    return next(((s, m) for m in layer.mixers if (s := spec_of(m)).prefix == prefix), None)


def build(cfg: MixerConfig, hidden_size: int, rope_for: RopeFor, tp: TPGroup | None) -> nn.Module:
    """The mixer module of `cfg` — ValueError when it holds a linear its kind declares neither
    quantizable nor kept float (it would otherwise stay unquantized unnoticed)."""
    spec = spec_of(cfg)
    module = spec.build(cfg, hidden_size, rope_for, tp)
    declared = {*spec.linears, *spec.float_linears}
    stray = [n for n, m in module.named_modules() if isinstance(m, nn.Linear) and n not in declared]
    if stray:
        raise ValueError(
            f"mixer kind {spec.kind!r}: linears {stray} are in neither linears nor float_linears"
        )
    return module


def chains_rows(cfg: ModelConfig) -> bool:
    """Whether every mixer of the model takes a sequence's consecutive tokens as decode rows."""
    return all(spec_of(m).chains_rows for layer in cfg.layers for m in layer.mixers)


def quantizable_linears() -> tuple[str, ...]:
    """`{prefix}.{leaf}` of every kind's quantizable linear (loading/quantize.py's mixer targets)."""
    return tuple(f"{s.prefix}.{leaf}" for s in _SPECS.values() for leaf in s.linears)


def cache_layout(cfg: ModelConfig) -> CacheLayout:
    """The model's cache: per layer, its mixers' declared tensors — paged for `Snapshot.BLOCKS` kinds, one
    row per sequence for `Snapshot.STATE_SLOT` ones (ValueError when two share a name in one layer) — or,
    for a layer whose mixer reads an earlier layer's cache (`MixerConfig.cache_source`), none and that
    layer's index (ValueError unless it is an earlier layer with a cache of its own and the only mixer).
    Each paged layer joins the KV group of its tensors' window (ValueError when one layer's paged tensors
    declare different windows); a reading layer joins its source's."""
    layers: list[LayerLayout] = []
    for i, layer in enumerate(cfg.layers):
        sources = {m.cache_source for m in layer.mixers} - {None}
        if sources:
            (j,) = sources if len(sources) == 1 and len(layer.mixers) == 1 else (None,)
            if j is None or not 0 <= j < i or layers[j].source is not None or not layers[j].paged:
                raise ValueError(
                    f"layer {i}: reads the cache of layer {sorted(sources)}, not an earlier one's own"
                )
            layers.append(LayerLayout(source=j))
            continue
        rows: dict[Snapshot, list[CacheTensor]] = {Snapshot.BLOCKS: [], Snapshot.STATE_SLOT: []}
        for m in layer.mixers:
            spec = spec_of(m)
            rows[spec.snapshot] += spec.cache(m)
        names = [t.name for ts in rows.values() for t in ts]
        if len(set(names)) != len(names):
            raise ValueError(f"layer {i}: its mixers' cache tensors {names} share a name")
        if len({t.window for t in rows[Snapshot.BLOCKS]}) > 1:
            raise ValueError(f"layer {i}: its paged cache tensors {names} declare different windows")
        layers.append(LayerLayout(tuple(rows[Snapshot.BLOCKS]), tuple(rows[Snapshot.STATE_SLOT])))
    windows = group_windows([layer.paged[0].window for layer in layers if layer.paged])
    group = {w: g for g, w in enumerate(windows)}
    grouped = []
    for layer in layers:
        own = layers[layer.source] if layer.source is not None else layer
        g = group[own.paged[0].window] if own.paged else 0
        grouped.append(replace(layer, group=g))
    return CacheLayout(tuple(grouped), windows)


# the modules whose SPEC is a kind
_KINDS = (attention, mla, mamba2, deltanet, short_conv, mamba1, kda, zamba2_shared)
for _module in _KINDS:
    register(_module.SPEC)
