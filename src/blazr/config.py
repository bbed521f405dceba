"""Typed, frozen configuration: what the model math and the engine are allowed to know.

`ModelConfig` describes one network as a tuple of `LayerConfig`s; each layer holds the configs of its mixers
(a tuple of `MixerConfig`s: GQA attention, MLA, Mamba2, gated DeltaNet — each kind's spec, beside its module,
is registered in model/mixers.py) and of its feed-forward (dense MLP or MoE), so a hybrid model is just a
tuple whose entries differ. Raw checkpoint keys (config.json, GGUF metadata, tensor names) are read only
in `detect.py`, which builds these objects; nothing below the loader ever sees a dict.

`EngineConfig` (serving limits, engine_config.py) is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal, TypeVar

import torch

NormKind = Literal["rms", "layer"]
# gelu: tanh approximation; gelu_erf: exact; swiglu_oai: GPT-OSS's clamped gated unit (MLPConfig)
Activation = Literal["silu", "gelu", "relu2", "gelu_erf", "swiglu_oai"]


@dataclass(frozen=True)
class NormConfig:
    """RMSNorm (`kind="rms"`) or LayerNorm with bias (`kind="layer"`, the oxidizr Mamba2 block norm).

    `weight_offset`: the checkpoint stores w of a scale `offset + w` ("(1 + w)" RMSNorms: Qwen3-Next /
    Qwen3.5, Gemma); the loader folds it into the weight, so the math is one RMSNorm with the whole scale."""

    kind: NormKind = "rms"
    eps: float = 1e-5
    weight_offset: float = 0.0


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding over the first `dim` features of a head, NeoX half-split layout.

    Interleaved-pair checkpoints (GGUF llama, DeepSeek) are permuted into the half-split layout at load, so
    the math has one layout. `scaling` selects the frequency/attention-scale rule: "default", "linear",
    "llama3" or "yarn" (`factor`, `original_max_position`, and the per-type fields below); "none" is NoPE
    kept in a rope's place (every angle 0: the `dim` features pass unrotated — Kimi-Linear's MLA);
    "longrope" (Phi-3 / Phi-4) divides each frequency by its own factor — `short_factor` for a context within
    `original_max_position`, `long_factor` beyond it, chosen once per model from its context limit
    (model/rope.py) — and multiplies cos/sin by `attention_factor`; "proportional" (Gemma 4's full layers)
    turns only the first `proportion` · dim/2 frequency pairs of the whole `dim` (θ^(−2i/dim) / `factor`) and
    leaves the others at angle 0 (their features pass unrotated).
    """

    dim: int
    theta: float = 10000.0
    scaling: Literal["default", "linear", "llama3", "yarn", "longrope", "proportional", "none"] = "default"
    factor: float = 1.0
    original_max_position: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    is_truncated: bool = True  # yarn: round the correction range to whole dims
    attention_factor: float = 1.0  # cos/sin multiplier (yarn mscale, longrope); 1.0 otherwise
    short_factor: tuple[float, ...] = ()  # longrope: a divisor per frequency [dim/2], context ≤ original
    long_factor: tuple[float, ...] = ()  # longrope: the same beyond original_max_position
    proportion: float = 1.0  # proportional: the share of the dim/2 frequency pairs that turn


@dataclass(frozen=True)
class MixerConfig:
    """The config of one mixer of a layer; `kind` names its spec in the registry (model/mixers.py).
    `is_input_addend`: the mixer reads the un-normed residual (and the token embeddings) and its output is
    added to the input of the layer's other mixers, before their norm, instead of to the residual (Zamba2's
    shared transformer block; model/block.py)."""

    kind: ClassVar[str]
    is_input_addend: ClassVar[bool] = False

    @property
    def cache_source(self) -> int | None:
        """The earlier layer whose cache this mixer reads instead of holding its own (None: its own)."""
        return None


M = TypeVar("M", bound=MixerConfig)


@dataclass(frozen=True)
class AttentionConfig(MixerConfig):
    """Grouped-query attention (Llama family). `rope=None` means no positional encoding (NoPE); a rope of
    `dim` < head_dim rotates the first `dim` features (partial rope).

    `qk_norm`: an RMSNorm of q and of k (own weights) before rope — over each head's features
    (`is_qk_norm_per_head`: Qwen3, Qwen3-Next, Gemma 3) or over all heads' (OLMo 2 / 3, OLMo-Hybrid);
    `is_qk_norm_across_ranks`: a tensor-parallel shard's all-heads norm, whose mean of squares spans every
    rank's heads (set by the shard, never by detection).
    `has_output_gate`: the q projection emits a gate per head beside q (Qwen3-Next / Qwen3.5: q_proj's rows
    per head [q_h; gate_h]); the attention output is multiplied by sigmoid(gate) before o_proj.
    `logit_softcap` c: the scaled scores s become c · tanh(s / c) before the mask and softmax (Gemma 2).
    `has_sinks`: a learned logit per query head (`sinks` [H]) joins each softmax's denominator and carries no
    value, so a query may attend to "nothing" (GPT-OSS).

    Gemma 4: `kv_source` j — the layer has no k / v projections (qkv_proj holds q's rows only) and attends
    to the keys and values layer j wrote to its cache (KV shared across layers: this layer's cache is
    layer j's, state/layout.py); `is_v_from_k` — no v projection (qkv_proj's rows [q | k]): the values are
    the k projection's output, taken before the k norm and rope; `has_v_norm` — the values are RMS-normed
    per head without weights (eps of `qk_norm`)."""

    kind: ClassVar[str] = "attention"

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RopeConfig | None
    softmax_scale: float
    has_qkv_bias: bool = False
    has_o_bias: bool = False
    sliding_window: int | None = None
    qk_norm: NormConfig | None = None
    is_qk_norm_per_head: bool = True
    is_qk_norm_across_ranks: bool = False
    has_output_gate: bool = False
    logit_softcap: float | None = None
    has_sinks: bool = False
    kv_source: int | None = None
    is_v_from_k: bool = False
    has_v_norm: bool = False

    @property
    def cache_source(self) -> int | None:
        return self.kv_source


@dataclass(frozen=True)
class Zamba2SharedConfig(MixerConfig):
    """One call of a Zamba2 shared transformer block (model/zamba2_shared.py). The block — `block` of the
    model's shared blocks, its weights held once however many layers call it — is
    `norm` → `attention` over concat(x, embeddings) [2D] (output D) → `norm` → gated `mlp`; each call adds
    its own LoRA adapters (rank `attention_adapter_rank` on q / k / v when not None, `mlp_adapter_rank` on
    gate_up), keeps its own KV cache, and projects the block's output through its own `linear` [D, D]. The
    result is added to the input of the layer's Mamba2 mixer (`is_input_addend`)."""

    kind: ClassVar[str] = "zamba2_shared"
    is_input_addend: ClassVar[bool] = True
    block: int
    attention: AttentionConfig  # over the 2D-wide concat; head_dim 2D / H
    mlp: MLPConfig
    norm: NormConfig
    attention_adapter_rank: int | None
    mlp_adapter_rank: int


@dataclass(frozen=True)
class MLAConfig(MixerConfig):
    """Multi-head Latent Attention (DeepSeek V2/V3 and the oxidizr variant).

    q path: `q_lora_rank=None` → one `q_proj` to all heads × (nope + rope); else `q_a_proj` → (norm) →
    `q_b_proj`. oxidizr: `is_q_rope_from_hidden` — the rope half of q comes from the hidden state through a
    separate projection while `q_b_proj` produces only the nope half. kv path: `kv_a_proj` → [c_kv | k_rope],
    `c_kv` (optionally normed) → `kv_b_proj` → per head [k_nope | v]. The cache holds only `c_kv` and the
    rotated `k_rope`.
    """

    kind: ClassVar[str] = "mla"
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope: RopeConfig
    softmax_scale: float
    has_latent_norms: bool = True
    is_q_rope_from_hidden: bool = False
    is_rope_interleaved: bool = False  # the checkpoint's rope rows are interleaved pairs: permuted at load
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class Mamba2Config(MixerConfig):
    """Mamba2 mixer (SSD). `d_inner = num_heads * head_dim`; conv runs over x, B and C
    (`conv_dim = d_inner + 2 * n_groups * state_size`)."""

    kind: ClassVar[str] = "mamba2"
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int = 256
    has_in_proj_bias: bool = False
    has_out_proj_bias: bool = False
    has_conv_bias: bool = True
    dt_min: float = 0.0
    dt_max: float = float("inf")
    has_gated_norm: bool = True
    norm_group_size: int = 0  # 0 → the whole d_inner (oxidizr); HF models use d_inner / n_groups
    is_norm_before_gate: bool = False
    norm_eps: float = 1e-5
    norm_spans_ranks: bool = False  # tensor parallel: the norm's group is the whole width across ranks

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.state_size


@dataclass(frozen=True)
class GatedDeltaNetConfig(MixerConfig):
    """Gated DeltaNet (Qwen3-Next, Qwen3.5 / 3.6, OLMo-Hybrid): a causal depthwise conv + SiLU over [q | k |
    v], L2-normed q and k, and per value head a [Dk, Dv] state updated by the gated delta rule
    (decay exp(g), g = −exp(A_log)·softplus(a + dt_bias); write strength β = beta_scale · sigmoid(b)); its
    output through a gated RMSNorm (per value head, norm then · silu(z)) and out_proj.

    Heads: Hk query / key heads of Dk features, Hv value heads of Dv (Hv a multiple of Hk). Value head h
    reads q / k head h // (Hv / Hk) ("grouped", HF's order) or, with `is_v_tiled`, h % Hk ("tiled":
    llama.cpp's converter orders Qwen3.5's value heads so; each per-value-head tensor follows that order)."""

    kind: ClassVar[str] = "deltanet"
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    is_v_tiled: bool = False
    beta_scale: float = 1.0  # OLMo-Hybrid's allow_neg_eigval: 2 (β in (0, 2))
    norm_eps: float = 1e-6
    chunk_size: int = 64  # tokens per chunk of the prefill's chunked (WY) form

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class KimiDeltaConfig(MixerConfig):
    """Kimi Delta Attention (Kimi-Linear): the gated delta rule with a channel-wise decay. Causal depthwise
    conv + SiLU over [q | k | v] (H heads of D each, q and k L2-normed), per head a [D, D] state decayed per
    key channel by exp(g), g = −exp(A_log[h]) · softplus(f_b(f_a(x)) + dt_bias) (one value per head and
    channel), written with strength β = sigmoid(b_proj(x)); the output through a gated RMSNorm per head
    (norm then · sigmoid(g_b(g_a(x)))) and o_proj. Key and value heads are one set (Hk = Hv = H, Dk = Dv =
    D); the low-rank gate projections are D wide."""

    kind: ClassVar[str] = "kda"
    num_heads: int
    head_dim: int
    conv_kernel: int = 4
    norm_eps: float = 1e-5
    chunk_size: int = 64  # tokens per chunk of the prefill's chunked (WY) form

    @property
    def width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return 3 * self.width


@dataclass(frozen=True)
class ShortConvConfig(MixerConfig):
    """LFM2's gated short convolution over `width` channels (the hidden size, or a tensor-parallel shard's
    part of it): in_proj → [B | C | x]; y = C · causal depthwise conv_L(B · x); out_proj. Its state is the
    last `conv_kernel − 1` inputs B · x."""

    kind: ClassVar[str] = "short_conv"
    width: int
    conv_kernel: int
    has_bias: bool = False


@dataclass(frozen=True)
class Mamba1Config(MixerConfig):
    """Mamba1 selective scan (Mamba, Falcon-Mamba, Jamba): in_proj → [x | z]; causal conv + SiLU over x;
    x_proj → [dt (dt_rank) | B | C (state_size each)], optionally RMS-normed (`has_dt_bc_norm`: Falcon-Mamba
    without weights, Jamba with); dt = softplus(dt_proj(dt)); per channel d a state of `state_size` with
    A = −exp(A_log[d]); y = C·state + D·x, gated by silu(z); out_proj."""

    kind: ClassVar[str] = "mamba1"
    d_inner: int
    state_size: int
    dt_rank: int
    conv_kernel: int
    has_conv_bias: bool = True
    has_proj_bias: bool = False  # in_proj and out_proj biases
    has_dt_bc_norm: bool = False
    has_norm_weights: bool = (
        False  # the dt / B / C norms have weights (Jamba); else weightless (Falcon-Mamba)
    )
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class MLPConfig:
    """Feed-forward: gated, `down(act(gate) * up)`, unless `is_gated=False`: `down(act(up))` (NemotronH).
    `swiglu_oai` (GPT-OSS, gated only): g = min(gate, limit), u = clamp(up, −limit, limit),
    `down((u + 1) · g · sigmoid(alpha · g))` with `swiglu_alpha`, `swiglu_limit`."""

    intermediate_size: int
    activation: Activation = "silu"
    is_gated: bool = True
    has_bias: bool = False
    swiglu_alpha: float = 1.702  # swiglu_oai only
    swiglu_limit: float = 7.0  # swiglu_oai only


@dataclass(frozen=True)
class MoEConfig:
    """Routed experts plus optional always-on shared experts.

    Routing: scores = softmax or sigmoid of router logits; experts chosen by top-k over scores (+ correction
    bias for selection only, DeepSeek-V3); optional group-limited selection (`num_groups`, `topk_groups`);
    weights renormalised over the chosen k when `is_renormalized`; scaled by `routed_scaling_factor`.
    `has_shared_gate`: the shared MLP's output is scaled per token by sigmoid of a [1, D] projection.
    `latent_size` (Nemotron 3 Super's latent MoE): the routed experts run in a smaller space — the router and
    the shared MLP read the hidden state, the experts `latent_down(x)` [T, latent_size], and their weighted
    sum goes back through `latent_up`; `has_latent_bias`: both projections have biases.
    Gemma 4: with `input_norm` the MoE reads the layer's un-normed residual x — the experts its RMSNorm
    `norm(x)` (own weights), the router the weightless RMSNorm of x times its `input_scale` [D] and D^-½;
    with `has_expert_scale` the renormalised weights are multiplied by `expert_scale[id]`.
    """

    num_experts: int
    top_k: int
    expert: MLPConfig
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    is_renormalized: bool = True
    routed_scaling_factor: float = 1.0
    num_groups: int = 1
    topk_groups: int = 1
    group_score: Literal["max", "top2_sum"] = "max"
    has_correction_bias: bool = False
    shared: MLPConfig | None = None
    has_shared_gate: bool = False  # the shared MLP's output × sigmoid(shared_gate(x)) (Qwen2-MoE, Qwen3-Next)
    latent_size: int | None = None  # the experts' width in and out (None: the hidden size)
    has_latent_bias: bool = False
    has_router_bias: bool = False  # the router's logits = x · Wᵀ + b (GPT-OSS)
    input_norm: NormConfig | None = None  # Gemma 4: the MoE norms the un-normed residual itself (see above)
    has_expert_scale: bool = False  # Gemma 4: the chosen weights × a learned scale per expert [E]


@dataclass(frozen=True)
class PerLayerInputConfig:
    """Gemma 4's per-layer inputs: each layer l reads a [size] vector per token, made once per forward from
    a second token table [vocab_size, L·size] (looked up, times sqrt(size)) and a projection of the scaled
    token embeddings [L·size, D] (times D^-½, RMS-normed per layer by `norm`), summed and scaled by 2^-½.
    Each layer gates it into its residual after the feed-forward:
    x += post_norm(proj(act(gate(x)) · input_l)), gate [size, D], proj [D, size] (model/per_layer.py)."""

    size: int
    vocab_size: int
    activation: Activation = "gelu"
    norm: NormConfig = field(default_factory=NormConfig)


@dataclass(frozen=True)
class LayerConfig:
    """One residual block. Its `mixers` run in parallel on the same normed input and their outputs are
    summed in order (FalconH1 holds attention and Mamba2; every other model holds one). `ffn` follows with
    its own pre-norm; a block may have no mixer (NemotronH MLP/MoE blocks) or no ffn (Mamba2 blocks).
    Norms: before each part (`norm`, `ffn_norm`; None: none) and after it, on its output before the
    residual add (`post_norm`, `ffn_post_norm`: OLMo 2 / 3 and OLMo-Hybrid's attention blocks norm only
    after, Gemma both). `has_output_scale`: the block's output (the whole residual) is multiplied by a
    learned scalar `out_scale` [1] (Gemma 4's layer_scalar). A layer with both an `mlp` and a `moe` runs them
    side by side on the residual (Gemma 4's MoE layers): ffn_post_norm(mlp_post_norm(mlp(ffn_norm(x))) +
    moe_post_norm(moe(x))) is added to x (the MoE norms its own input: MoEConfig.input_norm)."""

    mixers: tuple[MixerConfig, ...] = ()
    mlp: MLPConfig | None = None
    moe: MoEConfig | None = None
    norm: NormConfig | None = field(default_factory=NormConfig)  # before the mixer(s)
    ffn_norm: NormConfig | None = field(default_factory=NormConfig)  # before the mlp / moe
    post_norm: NormConfig | None = None  # on the mixers' output
    ffn_post_norm: NormConfig | None = None  # on the mlp / moe output
    has_output_scale: bool = False
    mlp_post_norm: NormConfig | None = None  # an MLP beside a MoE: on the MLP's output
    moe_post_norm: NormConfig | None = None  # an MLP beside a MoE: on the MoE's output

    @property
    def kind(self) -> str:
        """Human-readable kind, e.g. "mamba2", "attention+mlp", "mla+moe"."""
        ffn = [n for n, c in (("mlp", self.mlp), ("moe", self.moe)) if c]
        return "+".join([m.kind for m in self.mixers] + ffn)

    def mixer(self, of: type[M]) -> M | None:
        """This layer's mixer of config type `of`, or None (for what knows one kind: its names, a test)."""
        return next((m for m in self.mixers if isinstance(m, of)), None)


@dataclass(frozen=True)
class ModelConfig:
    """A whole network: embedding, `layers`, final norm, lm head.

    Scalar multipliers (Granite/FalconH1 µP) stay explicit here; per-weight ones are folded at load.
    `is_embedding_multiplier_rounded`: the multiplier is first rounded to the activations' dtype (Gemma's
    sqrt(hidden), a tensor of the embedding's dtype in transformers). `final_logit_softcap` c: the logits
    become c · tanh(logits / c) (Gemma 2). `per_layer_input`: Gemma 4's per-layer input embeddings.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    layers: tuple[LayerConfig, ...]
    final_norm: NormConfig = field(default_factory=NormConfig)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scale: float = 1.0  # logits are multiplied by this (Granite divides by logits_scaling)
    is_embedding_multiplier_rounded: bool = False
    final_logit_softcap: float | None = None
    per_layer_input: PerLayerInputConfig | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_indices(self, kind: str) -> list[int]:
        """Indices of the layers holding a mixer of this kind ("attention", "mla", "mamba2", …)."""
        return [i for i, layer in enumerate(self.layers) if any(m.kind == kind for m in layer.mixers)]

    def with_(self, **changes: object) -> ModelConfig:
        return replace(self, **changes)


DTypeName = Literal["auto", "float32", "bfloat16", "float16"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as users write it: torch.bfloat16 → "bfloat16" (the keys of DTYPES)."""
    return str(dtype).removeprefix("torch.")


# The engine's settings live in engine_config.py (flags generated from their fields); re-exported here.
from blazr.engine_config import EngineConfig as EngineConfig  # noqa: E402
from blazr.engine_config import SpeculativeConfig as SpeculativeConfig  # noqa: E402
from blazr.engine_config import SpeculativeMethod as SpeculativeMethod  # noqa: E402
