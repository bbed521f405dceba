"""Tensor parallel 2 == 1 (gloo, 2 ranks on this machine) for the short-conv and Mamba1 families, as
test_tensor_parallel.py checks the others: LFM2 (the short conv's channels split; attention heads with their
q / k norms), LFM2-MoE (its sigmoid experts expert-parallel), Mamba with projection biases (x_proj's
partial output all-reduced, the out_proj bias on rank 0 only), Falcon-Mamba (its dt / B / C norms over the
all-reduced x_proj output) and Jamba (Mamba1 + attention + softmax MoE): the same greedy tokens and their
logprobs within float32 rounding. And the per-rank slices tile the whole; a width that does not divide is
refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from blazr.config import Mamba1Config, ShortConvConfig
from blazr.detect import inspect_checkpoint
from blazr.distributed.shard import shard_config, slice_tensor
from blazr.errors import UnsupportedError
from tests.ssm_fixtures import randomise
from tests.test_tensor_parallel import check_two_ranks_match_one
from tests.tiny import build

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "lfm2": ("Lfm2ForCausalLM", dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"])),
    "lfm2-moe": (
        "Lfm2MoeForCausalLM",
        dict(
            num_hidden_layers=2,
            layer_types=["full_attention", "conv"],
            num_dense_layers=1,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
        ),
    ),
    "mamba-bias": ("MambaForCausalLM", dict(num_hidden_layers=2, time_step_rank=8, use_bias=True)),
    "falcon-mamba": ("FalconMambaForCausalLM", dict(num_hidden_layers=2, time_step_rank=8)),
    "jamba": (
        "JambaForCausalLM",
        dict(
            num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=1, num_experts=4, intermediate_size=96
        ),
    ),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, (arch, overrides) in FAMILIES.items():
        path = tmp_path_factory.mktemp(name)
        hf = build(arch, path, **overrides)
        randomise(hf, 2)
        hf.save_pretrained(path)
        out[name] = path
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_ranks_give_one_ranks_tokens_and_logprobs(checkpoints, family):
    check_two_ranks_match_one(checkpoints[family])


def test_the_shards_add_up(checkpoints):
    cfg = inspect_checkpoint(checkpoints["jamba"]).config
    half = shard_config(cfg, 2)
    m, part = cfg.layers[0].mixer(Mamba1Config), half.layers[0].mixer(Mamba1Config)
    assert part.d_inner * 2 == m.d_inner and (part.state_size, part.dt_rank) == (m.state_size, m.dt_rank)
    xz = torch.randn(2 * m.d_inner, cfg.hidden_size)
    pieces = [slice_tensor("layers.0.mamba1.in_proj.weight", xz, cfg, r, 2) for r in range(2)]
    x, z = xz.chunk(2)
    for r, piece in enumerate(pieces):  # rank r: its x channels, then its z channels
        assert torch.equal(piece, torch.cat([x.chunk(2)[r], z.chunk(2)[r]]))
    x_proj = torch.randn(m.dt_rank + 2 * m.state_size, m.d_inner)
    cols = [slice_tensor("layers.0.mamba1.x_proj.weight", x_proj, cfg, r, 2) for r in range(2)]
    assert torch.equal(torch.cat(cols, dim=1), x_proj)  # its partial outputs sum to the whole
    lfm2 = inspect_checkpoint(checkpoints["lfm2"]).config
    conv = lfm2.layers[0].mixer(ShortConvConfig)
    assert shard_config(lfm2, 2).layers[0].mixer(ShortConvConfig).width * 2 == conv.width
    with pytest.raises(UnsupportedError, match="short-conv channels is 128, not divisible by 3"):
        shard_config(lfm2.with_(layers=lfm2.layers[:1]), 3)
