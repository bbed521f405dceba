"""`--quantize int8 / int4 / bf16` on the short-conv and Mamba1 families (LFM2, LFM2-MoE, Mamba, Jamba): every
linear each mixer kind declares is made in the mode's kernel format (routed experts stacked; a dt_proj whose
rank is no multiple of 32 stays on the f32 kernel under the block kinds, as llama.cpp keeps it),
the logits stay close to the float model's (int8, bf16) or correlated with them (int4), the decode step is
one recorded plan, and whole prefill == chunked prefill == cached decode steps bit for bit, batched ==
alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blazr import LLM, SamplingParams
from blazr.kernels import q8_packed
from blazr.model import mixers
from blazr.model.moe import Experts
from blazr.model.qlinear import QuantizedLinear
from tests.drive import chunked, full_logits, stepwise_logits
from tests.hf_parity import prompts
from tests.ssm_fixtures import HEADS, randomise, single_thread
from tests.tiny import build

FAMILIES = {
    "lfm2": (
        "Lfm2ForCausalLM",
        dict(HEADS, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"]),
    ),
    "lfm2-moe": (
        "Lfm2MoeForCausalLM",
        dict(
            HEADS,
            num_hidden_layers=2,
            layer_types=["conv", "full_attention"],
            num_dense_layers=1,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
        ),
    ),
    "mamba": ("MambaForCausalLM", dict(num_hidden_layers=2, state_size=16, time_step_rank=32, use_bias=True)),
    "jamba": (
        "JambaForCausalLM",
        dict(
            HEADS,
            num_hidden_layers=4,
            attn_layer_period=4,
            attn_layer_offset=1,
            num_experts=4,
            intermediate_size=96,
            mamba_dt_rank=8,
        ),
    ),
}
KINDS = {"int8": "q8_0g", "int4": "q4_1", "bf16": "bf16"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Path, LLM]:
    arch, overrides = FAMILIES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = build(arch, path, seed=3, **overrides)
    randomise(hf, 4)
    hf.save_pretrained(path)
    return request.param, path, LLM(path, cpu=True, dtype="float32", quantize="none")


def _kl(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    top1 = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
    kl = F.kl_div(ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    return top1, float(kl.median())


def test_every_declared_linear_is_quantized_and_close(family):
    name, path, ref = family
    batch = prompts([40, 25], seed=6, vocab=ref.config.vocab_size)
    want = torch.cat(full_logits(ref.runner, batch))
    measured = {}
    for mode, kind in KINDS.items():
        llm = LLM(path, cpu=True, dtype="float32", quantize=mode)
        declared = set(mixers.quantizable_linears())
        found = {
            n: m for n, m in llm.model.named_modules() if n.count(".") == 3 and n.split(".", 2)[2] in declared
        }
        assert len(found) == sum(
            len(mixers.spec_of(m).linears) for layer in llm.config.layers for m in layer.mixers
        )
        linear_kind = q8_packed.runs_as() if mode == "int8" else kind  # a GGUF's Q8_0 layout here
        for n, m in found.items():  # a block kind needs rows of whole 32-blocks (else the f32 kernel)
            expect = linear_kind if kind == "bf16" or m.in_features % 32 == 0 else "f32"
            assert isinstance(m, QuantizedLinear) and m.kind == expect, (mode, n)
        experts = [e for e in llm.model.modules() if isinstance(e, Experts)]
        assert all(e.w_up is not None and e.w_up.kind == kind for e in experts)
        assert llm.runner.decode_plan is not None, mode
        measured[mode] = _kl(torch.cat(full_logits(llm.runner, batch)), want)
    # measured (top-1 agreement, median per-token KL) for LFM2 / LFM2-MoE / Mamba / Jamba: int8 0.94 / 0.94 /
    # 0.98 / 0.88, 1.6e-3 / 8e-4 / 3.9e-4 / 4.2e-3; int4 0.43 / 0.60 / 0.85 / 0.25, 0.11 / 0.07 / 0.03 / 0.27;
    # bf16 0.98 / 0.98 / 1.0 / 0.97, 7e-5 / 3e-5 / 2e-5 / 1.6e-4 (random tiny weights: many near-ties; Jamba's
    # softmax routing flips on a few tokens, so the median)
    (top8, kl8), (top4, kl4), (top16, kl16) = measured["int8"], measured["int4"], measured["bf16"]
    assert top8 >= 0.85 and 0 < kl8 <= 6e-3, (name, measured)
    assert top16 >= 0.95 and 0 < kl16 <= 3e-4, (name, measured)
    assert top4 >= 0.2 and 5 * kl8 < kl4 <= 0.4, (name, measured)


def test_quantized_schedules_agree_bit_for_bit(family):
    name, path, _ = family
    llm = LLM(path, cpu=True, dtype="float32", quantize="int8")
    batch = prompts([45, 20, 9], seed=4, vocab=llm.config.vocab_size)
    schedules = {
        "chunks of 7": [chunked(len(p), 7) for p in batch],
        "6 decode steps": [[len(p) - 6] + [1] * 6 for p in batch],
    }
    whole = stepwise_logits(llm, batch, [[len(p)] for p in batch])
    for sched, plan in schedules.items():
        for got, want in zip(stepwise_logits(llm, batch, plan), whole, strict=True):
            assert torch.equal(got, want), (name, sched)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in batch]
    assert [r.outputs[0].token_ids for r in llm.generate(batch, params)] == alone
