"""The server's continuous batching on a hybrid model (Mamba2 state slots + MLA latent cache + MoE):
16 concurrent greedy requests of different lengths == each alone, token for token."""

from __future__ import annotations

import pytest

from tests.oxidizr_fixtures import NANO, write_oxidizr
from tests.server_util import ServerProcess, check_batching_invariance, invariance_workload


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = write_oxidizr(tmp_path_factory.mktemp("hybrid"), NANO)  # [M, M, M, MLA+MoE, M, M, M, MLA+MoE]
    args = ["--model", str(path), "--max-num-batched-tokens", "64", "--max-model-len", "256"]
    with ServerProcess(args) as server:
        yield server


def test_hybrid_batching_invariance(hybrid):
    prompts, max_tokens = invariance_workload(vocab_size=NANO.vocab)
    check_batching_invariance(hybrid, prompts, max_tokens)
