"""engine/cuda_graphs.py on the CPU: the GraphDecoder with an eager stand-in for CUDA graph capture (the
captured function re-run on replay), so that its bucketing, padding rows, static buffers and in-graph
masks are checked against the eager decode path everywhere; the real CUDA capture runs where a GPU is
(benchmarks/NOTES.md records that run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.config import EngineConfig
from blazr.engine.cuda_graphs import GraphDecoder, is_supported
from tests.drive import assert_logits_close
from tests.tiny import build

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


class _EagerReplay:
    """Runs the captured function once at capture and again at each replay, into the same output."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.out = fn().clone()
        self.replays = 0

    def replay(self) -> None:
        self.out.copy_(self.fn())
        self.replays += 1


def eager_capture(fn):
    r = _EagerReplay(fn)
    return r, r.out


def _llm(path: Path) -> LLM:
    cfg = EngineConfig(max_num_seqs=6, max_model_len=160, max_num_batched_tokens=32, fused_decode=False)
    return LLM(path, cpu=True, dtype="float32", engine_config=cfg)


@pytest.fixture(scope="module", params=["llama", "mistral-window"])
def pair(request, tmp_path_factory) -> tuple[LLM, LLM]:
    """(graph-decoded, eager) LLMs on the same tiny checkpoint."""
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "llama":
        build("LlamaForCausalLM", path)
    else:
        build("MistralForCausalLM", path, sliding_window=20)
    graphs, eager = _llm(path), _llm(path)
    assert graphs.runner.decode_plan is None and graphs.runner.graphs is None  # CPU: no graphs by default
    assert graphs.runner.enable_graphs(eager_capture) is not None
    return graphs, eager


def _tokens(llm: LLM, prompts: list[list[int]], params) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


def test_greedy_tokens_equal_eager(pair) -> None:
    """Batches of 1-4 decoding sequences (buckets 1, 2, 4; padding rows in some steps), contexts crossing
    the key buckets 64 → 128 and Mistral's window of 20."""
    graphs, eager = pair
    decoder = graphs.runner.graphs
    assert isinstance(decoder, GraphDecoder)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (3, 50, 9, 70, 21)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 20, 5, 16, 9)]
    runs = decoder.num_runs
    assert _tokens(graphs, prompts, params) == _tokens(eager, prompts, params)
    assert decoder.num_runs - runs >= max(p.max_tokens for p in params) - 1  # decodes went through it
    batches = {b for b, _ in decoder.buckets}
    keys = {k for _, k in decoder.buckets}
    assert {1, 2, 4} <= batches and {64, 128} <= keys


def test_padding_rows_leave_real_sequences_alone(pair) -> None:
    """Three sequences decode in a bucket of four: each gets the tokens it gets alone (bucket one)."""
    graphs, eager = pair
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (11, 4, 30)]
    together = _tokens(graphs, prompts, GREEDY)
    assert together == [_tokens(graphs, [p], GREEDY)[0] for p in prompts]
    assert together == _tokens(eager, prompts, GREEDY)


def test_decode_logits_close_to_eager(pair) -> None:
    """One decode step's logits through the decoder vs the eager model on the same cache state (masked
    keys beyond each length change only the summation length: fp32-close)."""
    from tests.test_decode_plan import _decode_step_logits

    graphs, _ = pair
    runner = graphs.runner
    decoder = runner.graphs
    runner.decode_plan = decoder  # the helper drives the runner's fast path through `decode_plan`
    runner.graphs = None
    try:
        got, want = _decode_step_logits(graphs, [[5, 6, 7], list(range(40)), [9] * 17])
    finally:
        runner.graphs, runner.decode_plan = decoder, None
    for a, b in zip(got, want, strict=True):
        assert_logits_close(a, b, rel=1e-4)


def test_unsupported_models_get_no_decoder(tmp_path: Path) -> None:
    build("MixtralForCausalLM", tmp_path)  # MoE routing is data-dependent: not capturable
    llm = _llm(tmp_path)
    assert not is_supported(llm.config)
    assert llm.runner.enable_graphs(eager_capture) is None
