"""The embedded SmolLM2-135M-Instruct GGUF (Q4_1 + Q8_0 + F32 tensors) against transformers loading the
same file in float32: greedy tokens of a chat prompt identical, logits close."""

from __future__ import annotations

import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.detect import default_model_path
from tests.drive import assert_logits_close, full_logits

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(cpu=True, dtype="float32")


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def test_default_model_is_the_embedded_gguf(llm):
    assert llm.checkpoint.format == "gguf"
    assert llm.config.architecture == "LlamaForCausalLM"
    assert (llm.config.num_layers, llm.config.hidden_size, llm.config.vocab_size) == (30, 576, 49152)
    assert llm.config.tie_word_embeddings


def test_greedy_chat_tokens_match_transformers(llm, hf_model):
    ids = llm.tokenizer.encode_chat(MESSAGES)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    ours = llm.generate([ids], params)[0].outputs[0].token_ids
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = hf_model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )[0, len(ids) :].tolist()
    assert ours == ref


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
