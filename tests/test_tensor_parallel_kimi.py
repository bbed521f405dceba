"""Tensor parallel 2 == 1 (gloo, 2 ranks on this machine) for Kimi-Linear, as test_tensor_parallel.py checks
the other families: KDA by heads (each rank its heads' q / k / v rows and convs, their decay and β rows,
dt_bias, A_log and o_proj columns; the low-rank f_a / g_a projections and the output norm replicated), NoPE
MLA by heads, the sigmoid-routed experts expert-parallel beside the shared experts — the same greedy tokens
and their logprobs within float32 rounding; the per-rank slices tile the whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blazr.config import KimiDeltaConfig
from blazr.detect import inspect_checkpoint
from blazr.distributed.shard import shard_config, slice_tensor
from tests.ssm_fixtures import randomise
from tests.test_hf_kimi_linear import SIZES
from tests.test_tensor_parallel import check_two_ranks_match_one
from tests.tiny import build


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kimi-tp")
    hf = build("KimiLinearForCausalLM", path, **SIZES)
    randomise(hf, 2)
    hf.save_pretrained(path)
    return path


def test_two_ranks_give_one_ranks_tokens_and_logprobs(checkpoint):
    check_two_ranks_match_one(checkpoint)


def test_the_shards_add_up(checkpoint):
    cfg = inspect_checkpoint(checkpoint).config
    kda, part = cfg.layers[0].mixer(KimiDeltaConfig), shard_config(cfg, 2).layers[0].mixer(KimiDeltaConfig)
    assert part.num_heads * 2 == kda.num_heads and part.head_dim == kda.head_dim
    W = kda.width
    qkv = torch.randn(3 * W, cfg.hidden_size)
    pieces = [slice_tensor("layers.0.kda.qkv_proj.weight", qkv, cfg, r, 2) for r in range(2)]
    for r, piece in enumerate(pieces):  # rank r: its heads' q rows, then k, then v
        assert torch.equal(piece, torch.cat([t.chunk(2)[r] for t in qkv.chunk(3)]))
    o_proj = torch.randn(cfg.hidden_size, W)
    cols = [slice_tensor("layers.0.kda.o_proj.weight", o_proj, cfg, r, 2) for r in range(2)]
    assert torch.equal(torch.cat(cols, dim=1), o_proj)  # its partial outputs sum to the whole
    a_log = torch.randn(kda.num_heads)
    assert torch.equal(
        torch.cat([slice_tensor("layers.0.kda.A_log", a_log, cfg, r, 2) for r in range(2)]), a_log
    )
    f_a = torch.randn(kda.head_dim, cfg.hidden_size)
    assert slice_tensor("layers.0.kda.f_a_proj.weight", f_a, cfg, 1, 2) is f_a  # replicated
