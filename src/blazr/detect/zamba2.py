"""HF `Zamba2ForCausalLM` detection: Mamba2 layers, some of them hybrid — before its Mamba2 mixer a hybrid
layer calls one of `num_mem_blocks` shared transformer blocks (taken in turn) on concat(x, token
embeddings), and adds the call's output to the Mamba2 input (model/zamba2_shared.py). Each layer is
`input_layernorm` → Mamba2 (`mamba.`, in a hybrid layer `mamba_decoder.{input_layernorm, mamba}`) →
residual; a hybrid layer also holds its call's output `linear`. Final norm `final_layernorm`.

The shared blocks' weights lie under the hybrid layer that first calls each block
(`layers.{h}.shared_transformer.{input_layernorm, self_attn.{q,k,v,o}_proj, pre_ff_layernorm,
feed_forward.{gate_up,down}_proj}`; transformers saves the later calls' tied copies not at all, and any a
checkpoint does hold are left unread), and so do the adapters of every call of that block
(`…self_attn.linear_{q,k,v}_adapter_list.{j}.{0,1}`, `…feed_forward.gate_up_proj_adapter_list.{j}.{0,1}`,
j the call's index among the hybrid layers).

Sizes: the attention's head size is 2D / H (`attention_head_dim`) and its softmax scale (head size / 2)^-½;
rope over the whole head when `use_mem_rope`; the MLP's `hidden_act` "gelu" is the exact (erf) GELU; the
Mamba2 gated norm's eps is 1e-5 whatever `rms_norm_eps` says, its dt clamped below at `time_step_min`.
Layer kinds: `layers_block_type` ("mamba" / "linear_attention" / "hybrid"), else a layer is hybrid when it
holds `mamba_decoder.`. Without config.json: transformers' defaults (one group, chunk 256, eps 1e-5, no
rope, dt_min 0.001), `num_mem_blocks` the number of hybrid layers holding shared weights.
"""

from __future__ import annotations

import dataclasses
import math

from blazr.config import (
    LayerConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    Zamba2SharedConfig,
)
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, layer_indices, rope_from_raw
from blazr.detect.ssm_common import (
    MambaDefaults,
    MambaKeys,
    attention_config,
    has_prefix,
    is_tied,
    mamba_config,
    require,
    to_float,
)
from blazr.errors import CheckpointError

ARCH = "Zamba2ForCausalLM"
PREFIX = "model."
KEYS = MambaKeys(
    num_heads=("n_mamba_heads",),
    head_dim=("mamba_headdim",),
    state_size=("mamba_d_state",),
    n_groups=("mamba_ngroups",),
    conv_kernel=("mamba_d_conv",),
    chunk_size=("chunk_size",),
)
DEFAULTS = MambaDefaults(n_groups=1, chunk_size=256)
MAMBA_NORM_EPS = 1e-5  # Zamba2RMSNormGated(eps=1e-5), not rms_norm_eps
SHARED = "shared_transformer."


def _is_hybrid(raw: Raw, shapes: Shapes, num_layers: int) -> list[bool]:
    kinds = raw.get("layers_block_type") or raw.get("layer_types")
    if kinds is None:
        return [has_prefix(shapes, f"{PREFIX}layers.{i}.mamba_decoder.") for i in range(num_layers)]
    known = {"mamba": False, "linear_attention": False, "hybrid": True}
    if not isinstance(kinds, list) or len(kinds) != num_layers or any(k not in known for k in kinds):
        raise CheckpointError(
            f"{raw.path}: layers_block_type must list {num_layers} of mamba / linear_attention / hybrid, "
            f"found {kinds!r}"
        )
    return [known[k] for k in kinds]


def build_zamba2(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    found = layer_indices(shapes, PREFIX + "layers.")
    if not found:
        raise CheckpointError(f"no {PREFIX}layers.N.* tensors found")
    num_layers = raw.int("num_hidden_layers", max(found) + 1)
    is_hybrid = _is_hybrid(raw, shapes, num_layers)
    hybrids = [i for i, h in enumerate(is_hybrid) if h]
    holders = [i for i in hybrids if f"{PREFIX}layers.{i}.{SHARED}input_layernorm.weight" in shapes]
    num_blocks = raw.int("num_mem_blocks", len(holders))
    if hybrids and not 1 <= num_blocks <= len(holders):
        raise CheckpointError(
            f"{PREFIX}layers.{hybrids[0]}.{SHARED}input_layernorm.weight: expected the weights of "
            f"{num_blocks} shared blocks under the first hybrid layers, found them under layers {holders}"
        )
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    max_pos = raw.int("max_position_embeddings", 4096)
    dt_min = to_float(raw.get("time_step_min"), 0.001, f"{raw.path}: time_step_min")
    is_rope = bool(raw.get("use_mem_rope", False))
    layers = []
    for i, hybrid in enumerate(is_hybrid):
        p = f"{PREFIX}layers.{i}."
        mamba = mamba_config(
            raw,
            shapes,
            p + ("mamba_decoder.mamba." if hybrid else "mamba."),
            KEYS,
            DEFAULTS,
            dt_min=dt_min,
            dt_max=math.inf,
            norm_eps=MAMBA_NORM_EPS,
        )
        mixers: tuple[MixerConfig, ...] = (mamba,)
        if hybrid:
            call = hybrids.index(i)
            holder = hybrids[call % num_blocks]
            shared = _call(raw, shapes, call, holder, num_blocks, norm, is_rope, max_pos)
            mixers = (shared, mamba)
        layers.append(LayerConfig(mixers=mixers, norm=norm))
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _call(
    raw: Raw,
    shapes: Shapes,
    call: int,
    holder: int,
    num_blocks: int,
    norm: NormConfig,
    is_rope: bool,
    max_pos: int,
) -> Zamba2SharedConfig:
    """Hybrid call `call` of shared block call % num_blocks, whose weights lie under layer `holder`."""
    p = f"{PREFIX}layers.{holder}.{SHARED}"
    attention = attention_config(
        raw,
        shapes,
        p + "self_attn.",
        lambda head_dim: rope_from_raw(raw, head_dim, max_pos) if is_rope else None,
        None,
        ("attention_head_dim",),
    )
    # Zamba2 scales the scores by (head size / 2)^-½
    attention = dataclasses.replace(attention, softmax_scale=(attention.head_dim / 2) ** -0.5)
    gate_up = require(shapes, p + "feed_forward.gate_up_proj.weight")
    mlp = MLPConfig(
        intermediate_size=gate_up[0] // 2,
        activation=activation(raw.get("hidden_act", "gelu")),  # type: ignore[arg-type]
        has_bias=p + "feed_forward.gate_up_proj.bias" in shapes,
    )
    q_adapter = shapes.get(f"{p}self_attn.linear_q_adapter_list.{call}.0.weight")
    mlp_adapter = require(shapes, f"{p}feed_forward.gate_up_proj_adapter_list.{call}.0.weight")
    return Zamba2SharedConfig(
        block=call % num_blocks,
        attention=attention,
        mlp=mlp,
        norm=norm,
        attention_adapter_rank=q_adapter[0] if q_adapter else None,
        mlp_adapter_rank=mlp_adapter[0],
    )


def _is_zamba2(shapes: Shapes) -> bool:
    """A layer holding a `shared_transformer.` block beside its `mamba_decoder.`."""
    return any(".shared_transformer." in n for n in shapes) and any(".mamba_decoder." in n for n in shapes)


BUILDERS = {ARCH: build_zamba2}
MODEL_TYPES = {"zamba2": ARCH}
NAME_RULES = [(_is_zamba2, ARCH)]
