"""Every registered mixer kind reaches every consumer — no silent skip (design rule 11, model/mixers.py).

For each kind the registry holds, on sample configs of it: the block builds it under its prefix and its
declared linears are exactly the module's (quantize wraps them), tensor parallel cuts every parameter to the
shard's shape, names splits its fused parameters into parts that tile them, the cache holds what it declares
(paged or per sequence) and a cached prefill + decode step equals the cache-less forward, its snapshots copy
every state tensor (mid-chunk saves included), and plan / graph eligibility follows its flags. Then a kind
that is not registered is refused by every consumer, a spec that leaves a declaration out cannot be written
or registered, and a registered dummy kind is seen by each consumer.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

from blazr import kernels
from blazr.config import (
    AttentionConfig,
    EngineConfig,
    GatedDeltaNetConfig,
    KimiDeltaConfig,
    LayerConfig,
    Mamba1Config,
    Mamba2Config,
    MixerConfig,
    MLAConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    RopeConfig,
    ShortConvConfig,
    Zamba2SharedConfig,
)
from blazr.distributed.shard import shard_config, slice_tensor
from blazr.engine.cuda_graphs import is_supported
from blazr.engine.decode_plan import DecodePlan
from blazr.errors import UnsupportedError
from blazr.loading.absorb import absorb_mla
from blazr.loading.names import unfuse
from blazr.loading.quantize import wrap_float_linears
from blazr.model import mixers
from blazr.model.mixer_spec import MixerSpec
from blazr.model.model import CausalLM
from blazr.model.qlinear import Linear, QuantizedLinear
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import ModelCache
from blazr.state.layout import CacheTensor, Snapshot

HIDDEN = 64
SAMPLES: dict[str, list[MixerConfig]] = {
    "attention": [
        AttentionConfig(4, 2, 16, RopeConfig(dim=16), 0.25, has_qkv_bias=True, has_o_bias=True),
        AttentionConfig(4, 2, 16, None, 0.25, sliding_window=4),
        # the DeltaNet hybrids': gated, (1 + w) per-head q/k norm, partial rope; a q/k norm over all heads
        AttentionConfig(
            4, 2, 16, RopeConfig(dim=4), 0.25, qk_norm=NormConfig(weight_offset=1.0), has_output_gate=True
        ),
        AttentionConfig(4, 2, 16, None, 0.25, qk_norm=NormConfig(), is_qk_norm_per_head=False),
        # LFM2's: per-head q/k norm, NoPE here, a window
        AttentionConfig(4, 2, 16, None, 0.25, sliding_window=4, qk_norm=NormConfig()),
    ],
    "mla": [
        MLAConfig(4, None, 32, 16, 8, 16, RopeConfig(dim=8), 0.1),
        MLAConfig(4, 24, 32, 16, 8, 16, RopeConfig(dim=8), 0.1, is_q_rope_from_hidden=True),
        MLAConfig(4, None, 32, 16, 8, 16, RopeConfig(dim=8, scaling="none"), 0.1),  # Kimi-Linear's NoPE
    ],
    "mamba2": [
        Mamba2Config(4, 8, 8, 2, 4, has_in_proj_bias=True, has_out_proj_bias=True, norm_group_size=16),
        Mamba2Config(4, 8, 8, 1, 4),
    ],
    "deltanet": [
        GatedDeltaNetConfig(2, 4, 8, 12, chunk_size=4),
        GatedDeltaNetConfig(2, 4, 8, 8, conv_kernel=3, is_v_tiled=True, beta_scale=2.0),
    ],
    "short_conv": [ShortConvConfig(HIDDEN, 3), ShortConvConfig(HIDDEN, 4, has_bias=True)],
    # Kimi-Linear's KDA (its NoPE MLA is the last "mla" sample)
    "kda": [KimiDeltaConfig(2, 8, chunk_size=4), KimiDeltaConfig(4, 8, conv_kernel=3)],
    "mamba1": [
        Mamba1Config(32, 16, 8, 4, has_proj_bias=True),
        Mamba1Config(32, 8, 4, 3, has_conv_bias=False, has_dt_bc_norm=True, has_norm_weights=True),
    ],
    # Zamba2's shared-block call (alone in a layer: it writes its keys and values, and feeds no mixer)
    "zamba2_shared": [
        Zamba2SharedConfig(
            0,
            AttentionConfig(4, 4, 32, RopeConfig(dim=32), 0.25),
            MLPConfig(96, "gelu_erf"),
            NormConfig(),
            16,
            16,
        ),
        Zamba2SharedConfig(
            0,
            AttentionConfig(4, 2, 32, None, 0.25),
            MLPConfig(96, "gelu_erf", has_bias=True),
            NormConfig(),
            None,
            8,
        ),
    ],
}
KINDS = [s.kind for s in mixers.specs()]
CASES = [(kind, i) for kind in KINDS for i in range(len(SAMPLES.get(kind, ())))]


def _cfg(*mixer_cfgs: MixerConfig, mlp: bool = True) -> ModelConfig:
    layer = LayerConfig(mixers=mixer_cfgs, mlp=MLPConfig(128) if mlp else None)
    return ModelConfig("test", 64, HIDDEN, (layer,), max_position_embeddings=64)


def _sample(kind: str, i: int) -> tuple[MixerSpec, MixerConfig, ModelConfig]:
    m = SAMPLES[kind][i]  # a KeyError here: a new kind needs its samples above
    return mixers.spec_of(m), m, _cfg(m)


def _model(cfg: ModelConfig, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model


def test_every_registered_kind_has_samples_here():
    assert set(SAMPLES) == set(KINDS), "a registered kind needs sample configs in SAMPLES"


@pytest.mark.parametrize("kind, i", CASES)
def test_block_holds_it_under_its_prefix_and_quantize_takes_its_linears(kind, i):
    spec, _, cfg = _sample(kind, i)
    model = CausalLM(cfg)
    module = getattr(model.layers[0], spec.prefix)
    linears = {n for n, x in module.named_modules() if isinstance(x, nn.Linear)}
    assert linears <= {*spec.linears, *spec.float_linears}
    assert {f"{spec.prefix}.{leaf}" for leaf in spec.linears} <= set(mixers.quantizable_linears())
    wrap_float_linears(model)
    for name in linears:
        is_quantized = isinstance(module.get_submodule(name), QuantizedLinear)
        assert is_quantized == (name in spec.linears), name


@pytest.mark.parametrize("kind", KINDS)
def test_every_declared_linear_exists_in_some_sample(kind):
    spec = mixers.spec_of(SAMPLES[kind][0])
    found = set()
    for m in SAMPLES[kind]:
        module = getattr(CausalLM(_cfg(m)).layers[0], spec.prefix)
        found |= {n for n, x in module.named_modules() if isinstance(x, nn.Linear)}
    assert found == {*spec.linears, *spec.float_linears}


@pytest.mark.parametrize("kind, i", CASES)
def test_tensor_parallel_cuts_every_parameter_to_the_shards_shape(kind, i):
    spec, m, cfg = _sample(kind, i)
    full = CausalLM(cfg)
    shard = CausalLM(shard_config(cfg, 2))
    (part,) = shard.cfg.layers[0].mixers
    assert type(part) is type(m) and part != m
    names = [
        f"layers.0.{spec.prefix}.{n}" for n, _ in full.layers[0].get_submodule(spec.prefix).named_parameters()
    ]
    if isinstance(m, Zamba2SharedConfig):  # and the shared block it calls, held by the model
        names += [f"shared_blocks.{n}" for n, _ in full.get_submodule("shared_blocks").named_parameters()]
    for pname in names:
        want = shard.get_parameter(pname).shape
        pieces = [
            slice_tensor(pname, torch.randn(full.get_parameter(pname).shape), cfg, r, 2) for r in range(2)
        ]
        assert all(piece.shape == want for piece in pieces), pname


@pytest.mark.parametrize("kind, i", CASES)
def test_names_split_fused_parameters_into_parts_that_tile_them(kind, i):
    spec, _, cfg = _sample(kind, i)
    for name, p in CausalLM(cfg).named_parameters():
        if name.startswith(f"layers.0.{spec.prefix}."):
            parts, combine = unfuse(cfg, name, tuple(p.shape))
            assert all(part.name.startswith(f"layers.0.{spec.prefix}.") for part in parts)
            assert combine([torch.randn(part.shape) for part in parts]).shape == p.shape, name


def _prefill(n: int, slot: int = 0, saves: tuple[tuple[int, int, int], ...] = ()) -> ForwardBatch:
    """One fresh sequence of n tokens in token slots [16·slot, 16·slot + n) and state slot `slot`."""
    slots = torch.arange(n) + 16 * slot
    return ForwardBatch(
        positions=torch.arange(n),
        query_lens=(n,),
        context_lens=(0,),
        num_decodes=0,
        logits_indices=torch.arange(n),
        slot_mapping=slots,
        kv_indices=slots[None],
        state_slots=torch.tensor([slot]),
        state_saves=saves,
    )


def _decode(pos: int) -> ForwardBatch:
    return ForwardBatch(
        positions=torch.tensor([pos]),
        query_lens=(1,),
        context_lens=(pos,),
        num_decodes=1,
        logits_indices=torch.arange(1),
        slot_mapping=torch.tensor([pos]),
        kv_indices=torch.arange(pos + 1)[None],
        state_slots=torch.tensor([0]),
        decode_lens=torch.tensor([pos + 1]),
    )


@pytest.mark.parametrize("kind, i", CASES)
@torch.no_grad()
def test_the_cache_holds_what_it_declares_and_gives_the_cacheless_forward(kind, i):
    """NaN-filled pools: a prefill writes every declared tensor (its rows, or its state slot), and the
    prefill and a decode step read back what they wrote: logits equal the cache-less forward's."""
    spec, m, cfg = _sample(kind, i)
    layout = mixers.cache_layout(cfg)
    declared = spec.cache(m)
    (layer,) = layout.layers
    assert (layer.paged, layer.state) == (
        (declared, ()) if spec.snapshot is Snapshot.BLOCKS else ((), declared)
    )
    cache = ModelCache(layout, 48, 3, torch.float32)
    assert cache.nbytes() == 48 * layout.bytes_per_token(torch.float32) + 3 * layout.state_bytes_per_sequence(
        torch.float32
    )
    for t in cache.paged + cache.state:
        t.fill_(float("nan"))
    model, ids = _model(cfg), torch.randint(0, 64, (7,))
    want = model(ids, ForwardBatch.prefill([7]))
    got = model(ids[:6], _prefill(6), cache)
    torch.testing.assert_close(got, want[:6], rtol=1e-4, atol=1e-5)
    lc = cache.layer(0)
    for t in declared:
        rows = getattr(lc, t.name)[:6] if spec.snapshot is Snapshot.BLOCKS else getattr(lc, t.name)[:1]
        assert rows.isfinite().all(), f"{kind}: its {t.name} was not written"
    torch.testing.assert_close(model(ids[6:], _decode(6), cache), want[6:], rtol=1e-4, atol=1e-5)


def _rows(pos: int, n: int) -> ForwardBatch:
    """One sequence's tokens pos … pos + n − 1 as n decode rows of one batch (its state slot 0 for each)."""
    return ForwardBatch(
        positions=torch.arange(pos, pos + n),
        query_lens=(1,) * n,
        context_lens=tuple(range(pos, pos + n)),
        num_decodes=n,
        logits_indices=torch.arange(n),
        slot_mapping=torch.arange(pos, pos + n),
        kv_indices=torch.arange(pos + n).expand(n, pos + n).clone(),
        state_slots=torch.zeros(n, dtype=torch.long),
        decode_lens=torch.arange(pos + 1, pos + n + 1),
    )


def _moe_cfg(mixer: MixerConfig) -> ModelConfig:
    """A layer of `mixer` and a MoE with every linear a MoE can hold: a latent projection each way, a shared
    MLP and its gate."""
    moe = MoEConfig(4, 2, MLPConfig(32), shared=MLPConfig(48), has_shared_gate=True, latent_size=32)
    layer = LayerConfig(mixers=(mixer,), moe=moe)
    return ModelConfig("test", 64, HIDDEN, (layer,), max_position_embeddings=64)


@pytest.mark.parametrize("kind, i", CASES)
@torch.no_grad()
def test_every_linear_runs_as_its_batch_asks(kind, i):
    """One mechanism per forward (model/qlinear.py): every linear layer a kind holds — and the MLP's, the
    MoE's and the head's, float or on the kernels — is called with `decode` = the batch's is_decode_only,
    and a forward calls every linear the model holds (but for weights a kernel op reads directly)."""
    _, m, cfg = _sample(kind, i)
    for model_cfg in (cfg, _moe_cfg(m)):
        model = _model(model_cfg)
        wrap_float_linears(model)  # some layers on the kernels, some float: both take the word
        seen: dict[str, list[bool]] = {}
        for name, layer in model.named_modules():
            if isinstance(layer, Linear | QuantizedLinear):

                def hook(_, args, kwargs, name=name, seen=seen):
                    seen.setdefault(name, []).append(kwargs["decode"])

                layer.register_forward_pre_hook(hook, with_kwargs=True)
        linears = {n for n, x in model.named_modules() if isinstance(x, Linear | QuantizedLinear)}
        linears.discard("layers.0.moe.shared_gate")  # its one row: a kernel op on float32 CPU rows (moe.py)
        cache = ModelCache(mixers.cache_layout(model_cfg), 48, 3, torch.float32)
        ids = torch.randint(0, 64, (6,))
        model.compute_logits(model(ids[:5], _prefill(5), cache), decode=False)
        assert set(seen) == linears and not any(v for vs in seen.values() for v in vs), seen
        seen.clear()
        model.compute_logits(model(ids[5:], _rows(5, 1), cache), decode=True)
        assert set(seen) == linears - {"layers.0.mla.kv_b_proj"}, seen  # read by the absorbed form
        assert all(v for vs in seen.values() for v in vs), seen


@pytest.mark.parametrize("kind, i", CASES)
@torch.no_grad()
def test_a_kind_that_chains_rows_decodes_consecutive_tokens_as_rows(kind, i):
    """`chains_rows`: a prefill, then 4 consecutive tokens as 4 decode rows of one step, give what 4
    decode steps give (and the kernels' decode path, as the recorded plan runs it); a kind that does not
    declare it is never handed such rows (engine/runner.py)."""
    spec, _, cfg = _sample(kind, i)
    if not spec.chains_rows:
        return
    model, ids = _model(cfg), torch.randint(0, 64, (9,))
    want = model(ids, ForwardBatch.prefill([9]))
    wrap_float_linears(model)
    absorb_mla(model, "none")
    cache = ModelCache(mixers.cache_layout(cfg), 48, 3, torch.float32)
    model(ids[:5], _prefill(5), cache)
    got = model(ids[5:], _rows(5, 4), cache)  # a decode-only batch: every layer on its decode path
    torch.testing.assert_close(got, want[5:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind, i", CASES)
@torch.no_grad()
def test_snapshots_copy_every_state_tensor(kind, i):
    """STATE_SLOT kinds: a slot copy takes every state tensor, and a save inside a prefill chunk holds the
    state of that prefix; BLOCKS kinds: a token-slot copy takes every paged tensor."""
    spec, _, cfg = _sample(kind, i)
    cache = ModelCache(mixers.cache_layout(cfg), 48, 3, torch.float32)
    for t in cache.paged + cache.state:
        t.copy_(torch.randn_like(t))
    if spec.snapshot is Snapshot.BLOCKS:
        cache.copy_slots(torch.arange(4), torch.arange(16, 20))
        assert cache.paged and all(torch.equal(t[:4], t[16:20]) for t in cache.paged)
        return
    cache.copy_state_slots([(0, 1)])
    assert cache.state and all(torch.equal(t[0], t[1]) for t in cache.state)
    wide = ModelCache(mixers.cache_layout(cfg), 48, 12, torch.float32)
    # a few pairs copy whole slots, more an indexed copy
    for pairs in ([(0, 6), (1, 7)], [(0, 6), (1, 7), (2, 8), (3, 9), (4, 10), (5, 11)]):
        for t in wide.state:
            t.copy_(torch.randn_like(t))
        before = [t.clone() for t in wide.state]
        wide.copy_state_slots(pairs)
        for t, b in zip(wide.state, before, strict=True):
            want = b.clone()
            want[[d for _, d in pairs]] = b[[s for s, _ in pairs]]
            assert torch.equal(t, want)  # the destinations, and nothing else
    model, ids = _model(cfg), torch.randint(0, 64, (9,))
    model(ids, _prefill(9, saves=((0, 5, 2),)), cache)  # the state after 5 tokens → snapshot slot 2
    model(ids[:5], _prefill(5, slot=1), cache)  # those 5 tokens alone, in slot 1
    for t in cache.state:
        torch.testing.assert_close(t[2], t[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, i", CASES)
def test_plan_and_graph_eligibility_follow_the_spec(kind, i, caplog):
    spec, _, cfg = _sample(kind, i)
    assert is_supported(cfg) == (spec.graph_windows is not None)
    if not kernels.available():
        pytest.skip("the C kernel library is unavailable: no decode plan to record")
    model = _model(cfg)
    wrap_float_linears(model)
    absorb_mla(model, "none")
    cache = ModelCache(mixers.cache_layout(cfg), 256, 2, torch.float32)
    engine = EngineConfig(max_num_seqs=2, max_model_len=64)
    with caplog.at_level(logging.INFO, logger="blazr"):
        plan = DecodePlan.create(model, cache, engine, torch.device("cpu"), torch.float32)
    assert (plan is not None) == spec.is_plan_safe, caplog.text


# ------------------------------------------------------------------------------------ a kind unknown


@dataclass(frozen=True)
class DummyConfig(MixerConfig):
    kind: ClassVar[str] = "dummy"
    width: int = 8


class DummyMixer(nn.Module):
    """A stand-in kind: one projection and one per-sequence state row it keeps."""

    def __init__(self, cfg: DummyConfig, hidden_size: int) -> None:
        super().__init__()
        self.proj = Linear(hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: object) -> torch.Tensor:
        return self.proj(x, decode=batch.is_decode_only)


DUMMY = MixerSpec(
    config=DummyConfig,
    prefix="dummy",
    build=lambda cfg, hidden_size, rope_for, tp: DummyMixer(cfg, hidden_size),
    cache=lambda cfg: (CacheTensor("dummy_state", (cfg.width,), torch.float32),),
    snapshot=Snapshot.STATE_SLOT,
    linears=("proj",),
    float_linears=(),
    fused=lambda cfg, leaf: None,
    shard=lambda cfg, world, where: dataclasses.replace(cfg, width=cfg.width // world),
    slice=lambda cfg, leaf, t, rank, world: None,
    is_plan_safe=False,
    chains_rows=False,
    graph_windows=None,
)


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry that the test may add to."""
    monkeypatch.setattr(mixers, "_SPECS", dict(mixers._SPECS))


def test_a_kind_not_registered_is_refused_by_every_consumer():
    cfg = _cfg(SAMPLES["attention"][0], DummyConfig())
    consumers = {
        "block": lambda: CausalLM(cfg),
        "cache": lambda: mixers.cache_layout(cfg),
        "shard": lambda: shard_config(cfg, 2),
        "slice": lambda: slice_tensor("layers.0.dummy.proj.weight", torch.zeros(2, 2), cfg, 0, 2),
        "names": lambda: unfuse(cfg, "layers.0.dummy.proj.weight", (2, 2)),
        "graphs": lambda: is_supported(cfg),
    }
    for name, consume in consumers.items():
        with pytest.raises(UnsupportedError, match="DummyConfig is no registered kind"):
            consume()
            pytest.fail(f"{name} let an unregistered kind through")


def test_a_spec_missing_a_declaration_cannot_be_written():
    declared = {f.name: getattr(DUMMY, f.name) for f in dataclasses.fields(MixerSpec)}
    for name in declared:
        with pytest.raises(TypeError, match=name):
            MixerSpec(**{k: v for k, v in declared.items() if k != name})


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(linears=None), "linears"),
        (dict(linears=("proj",), float_linears=("proj",)), "overlap"),
        (dict(snapshot="blocks"), "snapshot"),
        (dict(is_plan_safe=None), "is_plan_safe"),
        (dict(chains_rows=1), "chains_rows"),
        (dict(cache=None), "cache: not callable"),
        (dict(slice=None), "slice: not callable"),
        (dict(graph_windows=(None,)), "graph_windows"),
        (dict(prefix="attn"), "prefix 'attn'"),
        (dict(prefix="mlp"), "prefix 'mlp'"),
        (dict(config=AttentionConfig), "registered already"),
        (dict(config=type("Kindless", (MixerConfig,), {})), "no `kind`"),
    ],
)
def test_register_refuses_a_bad_declaration(registry, change, why):
    with pytest.raises(ValueError, match=why):
        mixers.register(dataclasses.replace(DUMMY, **change))


def test_a_registered_kind_reaches_every_consumer(registry, caplog):
    mixers.register(DUMMY)
    cfg = _cfg(SAMPLES["attention"][0], DummyConfig())
    model = CausalLM(cfg)
    assert isinstance(model.layers[0].dummy, DummyMixer) and "dummy.proj" in mixers.quantizable_linears()
    assert wrap_float_linears(model) == 6  # attention's two, the MLP's two, the head … and dummy.proj
    assert isinstance(model.layers[0].dummy.proj, QuantizedLinear)
    layout = mixers.cache_layout(cfg)
    assert [t.name for t in layout.layers[0].state] == ["dummy_state"] and layout.has_paged
    assert shard_config(cfg, 2).layers[0].mixers[1] == DummyConfig(width=4)
    assert not is_supported(cfg)
    cache = ModelCache(layout, 32, 2, torch.float32)
    with caplog.at_level(logging.INFO, logger="blazr"):
        plan = DecodePlan.create(
            model, cache, EngineConfig(max_model_len=64), torch.device("cpu"), torch.float32
        )
    assert plan is None and "no kernel decode step for dummy" in caplog.text


def test_a_linear_declared_nowhere_fails_the_build(registry):
    mixers.register(dataclasses.replace(DUMMY, linears=()))
    with pytest.raises(ValueError, match=r"dummy.*\['proj'\] are in neither"):
        CausalLM(_cfg(DummyConfig()))
