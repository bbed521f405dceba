"""The embedded SmolLM2-135M-Instruct GGUF (Q4_1 + Q8_0 + F32 tensors) against transformers loading the
same file in float32: on the dequantized reference path (`quantize="none"`) greedy tokens of a chat prompt
identical and logits close; on the default path (the GGUF's blocks kept quantized, 8-bit activations) the
same greedy tokens up to near-ties (test_llama_cpp.py compares that path with llama.cpp on the same file);
in-situ int8 / int4 accuracy measured against the float path."""

from __future__ import annotations

import pytest
import torch

from blazr import LLM, SamplingParams
from tests.drive import assert_logits_close, full_logits
from tests.smollm2_reference import hf_float_model

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(cpu=True, dtype="float32", quantize="none")


@pytest.fixture(scope="module")
def quantized_llm() -> LLM:
    return LLM(cpu=True, dtype="float32")


@pytest.fixture(scope="module")
def hf_model():
    return hf_float_model()


def test_default_model_is_the_embedded_gguf(llm):
    assert llm.checkpoint.format == "gguf"
    assert llm.config.architecture == "LlamaForCausalLM"
    assert (llm.config.num_layers, llm.config.hidden_size, llm.config.vocab_size) == (30, 576, 49152)
    assert llm.config.tie_word_embeddings


def _hf_greedy(hf_model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():
        return hf_model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )[0, len(ids) :].tolist()


def test_greedy_chat_tokens_match_transformers(llm, hf_model):
    ids = llm.tokenizer.encode_chat(MESSAGES)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    ours = llm.generate([ids], params)[0].outputs[0].token_ids
    assert ours == _hf_greedy(hf_model, ids, 32)


# The reference runs fp32 activations; the quantized decode path rounds activations to 8 bits per block of
# 32 (as llama.cpp's Q4_1 path does), which moves logits by ~0.1, so a "near-tie" against the fp32
# reference is wider than the 0.05 that two 8-bit-activation engines agree to.
NEAR_TIE = 0.25  # logits


@pytest.mark.parametrize("prompt", [MESSAGES, [{"role": "user", "content": "Write a haiku about the sea."}]])
def test_quantized_greedy_tokens_match_up_to_near_ties(quantized_llm, hf_model, prompt):
    """The default path keeps the Q4_1 blocks; its greedy tokens equal the float reference's, except that
    they may part at a near-tie (the reference's two candidates within NEAR_TIE logits of each other)."""
    assert quantized_llm.model.layers[0].attn.qkv_proj.kind == "q4_1"
    assert quantized_llm.model.lm_head.kind == "q8_0g"
    ids = quantized_llm.tokenizer.encode_chat(prompt)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    ours = quantized_llm.generate([ids], params)[0].outputs[0].token_ids
    ref = _hf_greedy(hf_model, ids, 32)
    split = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), None)
    if split is not None:
        with torch.no_grad():
            logits = hf_model(input_ids=torch.tensor([ids + ref[:split]])).logits[0, -1]
        margin = float(logits[ref[split]] - logits[ours[split]])
        assert margin < NEAR_TIE, (
            f"token {split}: ours {ours[split]}, reference {ref[split]}, margin {margin}"
        )


def test_in_situ_quantization_accuracy_on_a_real_model(llm):
    """int8 / int4 of the float path's weights: top-1 agreement and KL(float ‖ quantized) per position over
    a chat transcript (the numbers go in the closing note of the speed issue)."""
    import torch.nn.functional as F

    text = [
        {"role": "user", "content": "Explain in three sentences why the sky is blue, then list 3 colours."},
        {"role": "assistant", "content": "Sunlight scatters off air molecules; blue light scatters most."},
        {"role": "user", "content": "And why are sunsets red? Answer like a pirate would."},
    ]
    ids = llm.tokenizer.encode_chat(text)
    ref = full_logits(llm.runner, [ids])[0]
    for mode, min_top1, max_kl in (("int8", 0.95, 0.02), ("int4", 0.75, 0.3)):
        q = LLM(cpu=True, dtype="float32", quantize=mode)
        ours = full_logits(q.runner, [ids])[0]
        top1 = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
        kl = float(
            F.kl_div(ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean")
        )
        print(f"{mode}: top-1 agreement {top1:.3f}, KL {kl:.4f} over {len(ids)} positions")
        assert top1 >= min_top1 and 0 < kl <= max_kl, (mode, top1, kl)


def test_logits_match_transformers(llm, hf_model):
    ids = llm.tokenizer.encode_chat(MESSAGES)
    ours = full_logits(llm.runner, [ids])[0]
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([ids])).logits[0]
    assert_logits_close(ours, ref)


def test_chat_answer_and_stop_on_im_end(llm):
    out = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=64))[0]
    assert "Paris" in out.text
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].token_ids[-1] == 2  # <|im_end|> ends the turn; it is not in the text
    assert "<|im_end|>" not in out.text


def test_quantized_batched_equals_alone(quantized_llm):
    """16 prompts of different lengths and max_tokens, batched (decodes through the recorded kernel plan,
    prefills unchunked) == each alone, token for token."""
    story = "the old fisherman told stories about storms and strange lights beyond the horizon"
    batch = [quantized_llm.tokenizer.encode(story[: 9 + 6 * i] * (1 + i // 8)) for i in range(16)]
    params = [SamplingParams(temperature=0, max_tokens=3 + (i * 5) % 13, ignore_eos=True) for i in range(16)]
    runner = quantized_llm.runner
    assert runner.decode_plan is not None
    together = [r.outputs[0].token_ids for r in quantized_llm.generate(batch, params)]
    assert max(runner.decode_plan.batch_sizes) > 8
    alone = [
        quantized_llm.generate([p], sp)[0].outputs[0].token_ids for p, sp in zip(batch, params, strict=True)
    ]
    assert together == alone
