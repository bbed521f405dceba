"""blazr's default quantized path against llama.cpp (llama-cpp-python) on the same file: the embedded
SmolLM2-135M-Instruct GGUF, its Q4_1 / Q8_0 blocks kept as stored.

Both engines quantize activations to 8 bits per block of 32 the same way (ggml's quantize_row_q8_*) and
compute the same integer block dots, but on this model a last-bit difference before a quantized matmul
(RMSNorm summation order, an exp polynomial, f16 attention arithmetic) can flip one 8-bit rounding, and
flips add up over 30 layers. llama.cpp shows it against itself: the same tokens evaluated as one batch,
one at a time, or as prompt + steps differ by up to ~2 logits (mean ~0.2) and their greedy argmax flips at
margins up to ~0.3 (measured; the numbers are printed). So "identical up to near-ties" is judged against
llama.cpp's own spread on the same sequence, never looser than NEAR_TIE:
- greedy tokens, teacher-forced along llama.cpp's greedy sequence, may differ from llama.cpp's only where
  llama.cpp's margin between the two tokens is ≤ max(NEAR_TIE, the widest margin at which llama.cpp's
  own evaluation orders disagree); free-running, the first token where the two part must be such a
  near-tie for llama.cpp or a near-tie (≤ NEAR_TIE) in blazr's own logits at that step — the decode
  step's last-bit arithmetic (attention summation order) moves blazr's margins by ~0.1 logit, as
  llama.cpp's evaluation orders move its own;
- the mean |Δlogit| to llama.cpp is within 1.5× of llama.cpp's own spread.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.detect import default_model_path
from tests.drive import stepwise_logits

NEAR_TIE = 0.05  # logits: the floor of the near-tie margin
NUM_TOKENS = 48
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three primary colours and explain why they are called primary."}],
]


@pytest.fixture(scope="module")
def ours() -> LLM:
    llm = LLM(cpu=True)
    assert llm.model.layers[0].attn.qkv_proj.kind == "q4_1" and llm.model.lm_head.kind == "q8_0"
    return llm


@pytest.fixture(scope="module")
def reference():
    from llama_cpp import Llama

    return Llama(
        model_path=str(default_model_path()),
        n_ctx=512,
        n_threads=torch.get_num_threads(),
        n_threads_batch=torch.get_num_threads(),
        logits_all=True,
        verbose=False,
    )


def _llama_logits(llm, seq: list[int], start: int, order: str) -> np.ndarray:
    """llama.cpp's logits predicting seq[start:], [len(seq) - start, V], with the tokens evaluated as one
    batch ("batched"), one at a time ("tokenwise"), or the first `start` as a batch and then one at a
    time ("steps", how greedy generation runs)."""
    llm.reset()
    if order == "batched":
        llm.eval(seq)
    elif order == "tokenwise":
        for t in seq:
            llm.eval([t])
    else:
        llm.eval(seq[:start])
        for t in seq[start:]:
            llm.eval([t])
    return np.array(llm.scores[start - 1 : len(seq) - 1], dtype=np.float32)


def _llama_greedy(llm, ids: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(ids)
    tokens: list[int] = []
    for _ in range(n):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([tokens[-1]])
    return tokens


def _flip_margins(logits: np.ndarray, ref: np.ndarray) -> list[float]:
    """At each position where argmax(logits) is not argmax(ref): ref's margin between the two."""
    a, r = logits.argmax(-1), ref.argmax(-1)
    return [float(ref[i, r[i]] - ref[i, a[i]]) for i in np.nonzero(a != r)[0]]


@pytest.mark.parametrize("messages", PROMPTS, ids=["capital", "haiku", "colours"])
def test_greedy_tokens_match_llama_cpp_up_to_near_ties(ours: LLM, reference, messages) -> None:
    ids = ours.tokenizer.encode_chat(messages)
    ref_tokens = _llama_greedy(reference, ids, NUM_TOKENS)
    seq = ids + ref_tokens
    steps = _llama_logits(reference, seq, len(ids), "steps")  # [n, V]; argmax = ref_tokens
    assert steps.argmax(-1).tolist() == ref_tokens
    # llama.cpp against itself
    others = [_llama_logits(reference, seq, len(ids), order) for order in ("batched", "tokenwise")]
    self_flips = [m for o in others for m in _flip_margins(o, steps)]
    self_spread = max(float(np.abs(o - steps).mean()) for o in others)
    tie = max([NEAR_TIE, *self_flips])
    # blazr teacher-forced along llama.cpp's greedy sequence (prefill == decode arithmetic in blazr)
    logits = stepwise_logits(ours.runner, [seq], [[len(seq)]])[0][len(ids) - 1 : -1].numpy()
    flips = _flip_margins(logits, steps)
    spread = float(np.abs(logits - steps).mean())
    print(
        f"\nllama.cpp vs itself: flips at margins {np.round(self_flips, 3).tolist()}, "
        f"mean |Δ| {self_spread:.3f}\nblazr vs llama.cpp:  flips at margins {np.round(flips, 3).tolist()}, "
        f"mean |Δ| {spread:.3f}, max |Δ| {np.abs(logits - steps).max():.3f}"
    )
    assert all(m <= tie for m in flips), (flips, tie)
    assert spread <= 1.5 * self_spread, (spread, self_spread)
    # free-running greedy: the first token where the two part is a near-tie for llama.cpp or for blazr
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=20)
    out = ours.generate([ids], params)[0].outputs[0]
    got = out.token_ids
    split = next((i for i, (a, b) in enumerate(zip(got, ref_tokens, strict=True)) if a != b), None)
    if split is not None:
        margin = float(steps[split, ref_tokens[split]] - steps[split, got[split]])
        top = dict(out.logprobs[split].top)  # log-softmax differences = logit differences
        ours_margin = top[got[split]] - top.get(ref_tokens[split], -np.inf)
        print(f"free-running split at token {split}: margins llama.cpp {margin:.3f}, blazr {ours_margin:.3f}")
        assert margin <= tie or ours_margin <= NEAR_TIE, (
            f"token {split}: ours {got[split]}, llama.cpp {ref_tokens[split]}, {margin=}, {ours_margin=}"
        )
    print(f"free-running: identical for {NUM_TOKENS if split is None else split} tokens")
