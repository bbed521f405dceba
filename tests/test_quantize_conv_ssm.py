"""`--quantize int8 / int4 / bf16` on the short-conv and Mamba1 families (LFM2, LFM2-MoE, Mamba, Falcon-Mamba,
Jamba): every linear each mixer kind declares is made in the mode's kernel format (routed experts stacked),
the logits stay close to the float model's (int8, bf16) or correlated with them (int4), the decode step is
one recorded plan, and whole prefill == chunked prefill == cached decode steps bit for bit, batched ==
alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blazr import LLM, SamplingParams
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
    kl = F.kl_div(ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean")
    return top1, float(kl)


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
        assert all(isinstance(m, QuantizedLinear) and m.kind == kind for m in found.values()), mode
        experts = [e for e in llm.model.modules() if isinstance(e, Experts)]
        assert all(e.w_up is not None and e.w_up.kind == kind for e in experts)
        assert llm.runner.decode_plan is not None, mode
        measured[mode] = _kl(torch.cat(full_logits(llm.runner, batch)), want)
    # measured (LFM2 / LFM2-MoE): int8 top-1 0.94, KL 0.0018 / 0.0009; int4 0.43 / 0.60, 0.13 / 0.075; bf16
    # 0.98, 9e-5 / 4e-5 (random tiny weights: many near-ties)
    (top8, kl8), (top4, kl4), (top16, kl16) = measured["int8"], measured["int4"], measured["bf16"]
    assert top8 >= 0.88 and 0 < kl8 <= 4e-3, (name, measured)
    assert top16 >= 0.95 and 0 < kl16 <= 5e-4, (name, measured)
    assert top4 >= 0.3 and 5 * kl8 < kl4 <= 0.3, (name, measured)


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
