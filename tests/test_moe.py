"""MoE parity with transformers' MoE modules on copied weights (Mixtral, DeepSeek-V2/V3, NemotronH,
GraniteMoeHybrid, oxidizr = Mixtral + always-on shared MLP), the grouped expert compute against the per-token
reference loop, and the property that only experts that received tokens are computed.

Shapes: T tokens, D hidden, E experts, I expert width.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from blazr.config import MLPConfig, MoEConfig
from blazr.model.mlp import MLP
from blazr.model.moe import MoE

D, I, E, T = 64, 96, 8, 37


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _randomize(module: nn.Module, std: float = 0.2) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)


def _tokens(n: int = T) -> torch.Tensor:
    return torch.randn(n, D)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _copy_shared(ours: MLP, gate: torch.Tensor | None, up: torch.Tensor, down: torch.Tensor) -> None:
    with torch.no_grad():
        if gate is None:
            ours.up_proj.weight.copy_(up)
        else:
            ours.gate_up_proj.weight.copy_(torch.cat((gate, up)))
        ours.down_proj.weight.copy_(down)


def _copy_routed(ours: MoE, router: torch.Tensor, experts: nn.Module) -> None:
    with torch.no_grad():
        ours.router.weight.copy_(router)
        if hasattr(ours.experts, "gate_up_proj"):
            ours.experts.gate_up_proj.copy_(experts.gate_up_proj)
        else:
            ours.experts.up_proj.copy_(experts.up_proj)
        ours.experts.down_proj.copy_(experts.down_proj)


def _mixtral(k: int = 2):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    hf = MixtralSparseMoeBlock(
        MixtralConfig(hidden_size=D, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k)
    ).eval()
    _randomize(hf)
    return hf


def test_mixtral_routing_equals_hf():
    hf = _mixtral()
    ours = MoE(MoEConfig(num_experts=E, top_k=2, expert=MLPConfig(I)), D)
    _copy_routed(ours, hf.gate.weight, hf.experts)
    x = _tokens()
    with torch.no_grad():
        _close(ours(x), hf(x[None])[0])


def test_oxidizr_is_mixtral_plus_shared_mlp():
    hf = _mixtral()
    shared_cfg = MLPConfig(I)
    shared = MLP(shared_cfg, D)
    _randomize(shared)
    ours = MoE(MoEConfig(num_experts=E, top_k=2, expert=MLPConfig(I), shared=shared_cfg), D)
    _copy_routed(ours, hf.gate.weight, hf.experts)
    ours.shared.load_state_dict(shared.state_dict())
    x = _tokens()
    with torch.no_grad():
        _close(ours(x), hf(x[None])[0] + shared(x, decode=False))


def _deepseek_shared(ours: MoE, hf_shared: nn.Module) -> None:
    _copy_shared(
        ours.shared, hf_shared.gate_proj.weight, hf_shared.up_proj.weight, hf_shared.down_proj.weight
    )


def test_deepseek_v3_group_limited_equals_hf():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    hf_cfg = DeepseekV3Config(
        hidden_size=D,
        moe_intermediate_size=I,
        n_routed_experts=E,
        num_experts_per_tok=2,
        n_shared_experts=2,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )
    hf = DeepseekV3MoE(hf_cfg).eval()
    _randomize(hf)
    with torch.no_grad():
        hf.gate.e_score_correction_bias.copy_(torch.randn(E) * 0.3)
    cfg = MoEConfig(
        num_experts=E,
        top_k=2,
        expert=MLPConfig(I),
        scoring="sigmoid",
        is_renormalized=True,
        routed_scaling_factor=2.5,
        num_groups=2,
        topk_groups=1,
        group_score="top2_sum",
        has_correction_bias=True,
        shared=MLPConfig(2 * I),
    )
    ours = MoE(cfg, D)
    _copy_routed(ours, hf.gate.weight, hf.experts)
    with torch.no_grad():
        ours.router.correction_bias.copy_(hf.gate.e_score_correction_bias)
    _deepseek_shared(ours, hf.shared_experts)
    x = _tokens(64)
    # the bias must change the selection somewhere, or this test would not exercise it
    _, biased = ours.router(x)
    with torch.no_grad():
        ours.router.correction_bias.zero_()
        _, unbiased = ours.router(x)
        ours.router.correction_bias.copy_(hf.gate.e_score_correction_bias)
    assert not torch.equal(biased.sort(-1).values, unbiased.sort(-1).values)
    with torch.no_grad():
        _close(ours(x), hf(x[None])[0])


def test_deepseek_v2_group_limited_greedy_equals_hf():
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

    hf_cfg = DeepseekV2Config(
        hidden_size=D,
        moe_intermediate_size=I,
        n_routed_experts=E,
        num_experts_per_tok=3,
        n_shared_experts=1,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=16.0,
    )
    hf = DeepseekV2Moe(hf_cfg).eval()
    _randomize(hf)
    cfg = MoEConfig(
        num_experts=E,
        top_k=3,
        expert=MLPConfig(I),
        scoring="softmax",
        is_renormalized=False,
        routed_scaling_factor=16.0,
        num_groups=4,
        topk_groups=2,
        group_score="max",
        shared=MLPConfig(I),
    )
    ours = MoE(cfg, D)
    _copy_routed(ours, hf.gate.weight, hf.experts)
    _deepseek_shared(ours, hf.shared_experts)
    x = _tokens()
    with torch.no_grad():
        _close(ours(x), hf(x[None])[0])


def test_nemotron_h_relu2_ungated_equals_hf():
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMoE

    hf_cfg = NemotronHConfig(
        hidden_size=D,
        moe_intermediate_size=I,
        moe_shared_expert_intermediate_size=2 * I,
        n_routed_experts=E,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.0,
        mlp_hidden_act="relu2",
        mlp_bias=False,
    )
    hf = NemotronHMoE(hf_cfg).eval()
    _randomize(hf)
    with torch.no_grad():
        hf.gate.e_score_correction_bias.copy_(torch.randn(E) * 0.3)
    cfg = MoEConfig(
        num_experts=E,
        top_k=2,
        expert=MLPConfig(I, activation="relu2", is_gated=False),
        scoring="sigmoid",
        is_renormalized=True,
        routed_scaling_factor=2.0,
        group_score="top2_sum",
        has_correction_bias=True,
        shared=MLPConfig(2 * I, activation="relu2", is_gated=False),
    )
    ours = MoE(cfg, D)
    _copy_routed(ours, hf.gate.weight, hf.experts)
    with torch.no_grad():
        ours.router.correction_bias.copy_(hf.gate.e_score_correction_bias)
    _copy_shared(ours.shared, None, hf.shared_experts.up_proj.weight, hf.shared_experts.down_proj.weight)
    x = _tokens()
    with torch.no_grad():
        _close(ours(x), hf(x[None])[0])


def test_granite_moe_hybrid_with_shared_mlp_equals_hf():
    from transformers import GraniteMoeHybridConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
        GraniteMoeHybridMLP,
        GraniteMoeHybridMoE,
    )

    hf_cfg = GraniteMoeHybridConfig(
        hidden_size=D,
        intermediate_size=I,
        shared_intermediate_size=2 * I,
        num_local_experts=E,
        num_experts_per_tok=2,
    )
    hf_moe, hf_shared = GraniteMoeHybridMoE(hf_cfg).eval(), GraniteMoeHybridMLP(hf_cfg).eval()
    _randomize(hf_moe)
    _randomize(hf_shared)
    ours = MoE(MoEConfig(num_experts=E, top_k=2, expert=MLPConfig(I), shared=MLPConfig(2 * I)), D)
    _copy_routed(ours, hf_moe.router.weight, hf_moe.experts)
    with torch.no_grad():  # input_linear [2I_s, D] is gate rows then up rows, like our gate_up_proj
        ours.shared.gate_up_proj.weight.copy_(hf_shared.input_linear.weight)
        ours.shared.down_proj.weight.copy_(hf_shared.output_linear.weight)
    x = _tokens()
    with torch.no_grad():
        _close(ours(x), hf_moe(x[None])[0] + hf_shared(x))


VARIANTS = {
    "mixtral": MoEConfig(num_experts=E, top_k=2, expert=MLPConfig(I)),
    "top1-shared": MoEConfig(num_experts=E, top_k=1, expert=MLPConfig(I), shared=MLPConfig(I)),
    "v2-groups": MoEConfig(
        num_experts=E, top_k=3, expert=MLPConfig(I), is_renormalized=False, routed_scaling_factor=3.0,
        num_groups=4, topk_groups=2,
    ),
    "v3-sigmoid": MoEConfig(
        num_experts=E, top_k=2, expert=MLPConfig(I, activation="gelu"), scoring="sigmoid",
        routed_scaling_factor=2.5, num_groups=2, topk_groups=1, group_score="top2_sum",
        has_correction_bias=True,
    ),
    "relu2": MoEConfig(
        num_experts=E, top_k=2, expert=MLPConfig(I, activation="relu2", is_gated=False),
        shared=MLPConfig(I, activation="relu2", is_gated=False),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(VARIANTS))
def test_grouped_equals_reference(name):
    ours = MoE(VARIANTS[name], D)
    _randomize(ours)
    x = _tokens(50)
    with torch.no_grad():
        _close(ours(x), ours.forward_reference(x))


def test_grouped_equals_reference_bfloat16():
    ours = MoE(VARIANTS["mixtral"], D)
    _randomize(ours)
    ours = ours.to(torch.bfloat16)
    x = _tokens(50).to(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ours.forward_reference(x), rtol=2e-2, atol=2e-2)


def test_only_selected_experts_are_computed(monkeypatch):
    """Force every token onto experts {2, 5}: the grouped forward computes exactly those two, once each."""
    ours = MoE(MoEConfig(num_experts=E, top_k=2, expert=MLPConfig(I)), D)
    _randomize(ours)
    with torch.no_grad():
        ours.router.weight.zero_()
        ours.router.weight[2] = 1.0
        ours.router.weight[5] = 1.0
    x = _tokens().abs()  # positive rows ⇒ logits of experts 2 and 5 are the only positive ones
    calls: list[tuple[int, int]] = []
    real_expert = ours.experts.expert

    def spy(e: int, h: torch.Tensor) -> torch.Tensor:
        calls.append((e, h.shape[0]))
        return real_expert(e, h)

    monkeypatch.setattr(ours.experts, "expert", spy)
    with torch.no_grad():
        out = ours(x)
    assert sorted(calls) == [(2, T), (5, T)]
    monkeypatch.undo()
    with torch.no_grad():
        _close(out, ours.forward_reference(x))


def test_work_is_proportional_to_assignments(monkeypatch):
    """Across random routing, the grouped path computes each (token, expert) assignment exactly once and
    never calls an expert that received no tokens."""
    ours = MoE(MoEConfig(num_experts=E, top_k=2, expert=MLPConfig(I)), D)
    _randomize(ours)
    x = _tokens(5)  # 5 tokens × 2 < 8 experts: some experts must be idle
    rows: dict[int, int] = {}
    real_expert = ours.experts.expert

    def spy(e: int, h: torch.Tensor) -> torch.Tensor:
        rows[e] = rows.get(e, 0) + h.shape[0]
        return real_expert(e, h)

    monkeypatch.setattr(ours.experts, "expert", spy)
    with torch.no_grad():
        _, ids = ours.router(x)
        ours(x)
    expected = torch.bincount(ids.flatten(), minlength=E)
    assert rows == {e: int(n) for e, n in enumerate(expected) if n}
    assert len(rows) < E
