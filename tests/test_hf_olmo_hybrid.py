"""OLMo-Hybrid parity with transformers: gated DeltaNet layers with their own q / k / v / g / a / b
projections, one conv per q / k / v as the published checkpoints hold them, β in (0, 2)
(`linear_allow_neg_eigval`), in pre-norm blocks; OLMo 3 attention (q/k RMSNorm over all heads' features)
in post-norm blocks, with rope or NoPE (the released checkpoints'). Whole / chunked prefill, decode, mixed
batches, batched == alone; the prefix cache on == off; `--quantize int8`; tensor parallel 2 ranks == 1."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from blazr import LLM, SamplingParams
from blazr.config import AttentionConfig, GatedDeltaNetConfig
from tests.drive import full_logits
from tests.hf_parity import ParityTests, check_batched_equals_alone, check_cache_invariants, prompts
from tests.ssm_fixtures import Pair, layer_kinds, randomise, single_thread
from tests.tiny import TINY

SIZES = dict(
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24, initializer_range=0.05,
    pad_token_id=0, eos_token_id=1,
)  # fmt: skip
VARIANTS = {"nope": None, "rope": {"rope_type": "default", "rope_theta": 10000.0}}


def save_as_published(hf: torch.nn.Module, path) -> None:
    """Save in the published checkpoints' names (transformers' default, `save_original_format`), with each
    layer's q / k / v convs cut at their true widths (transformers cuts the fused conv in equal thirds)."""
    hf.save_pretrained(path)
    file = next(path.glob("*.safetensors"))
    state = load_file(file)
    for i, layer in enumerate(hf.model.layers):
        if hasattr(layer, "linear_attn"):
            a = layer.linear_attn
            q, k, v = a.conv1d.weight.detach().split([a.key_dim, a.key_dim, a.value_dim])
            for name, t in (("q", q), ("k", k), ("v", v)):
                state[f"model.layers.{i}.linear_attn.{name}_conv1d.weight"] = t.contiguous()
    save_file(state, file, metadata={"format": "pt"})


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory) -> Pair:
    import transformers

    cfg = transformers.OlmoHybridConfig(**{**TINY, **SIZES}, rope_parameters=VARIANTS[request.param])
    cfg.rope_parameters = VARIANTS[request.param]  # None: NoPE (the config's defaults would fill in a θ)
    torch.manual_seed(0)
    hf = transformers.OlmoHybridForCausalLM(cfg).float().eval()
    randomise(hf, 1)
    path = tmp_path_factory.mktemp(f"olmo-hybrid-{request.param}")
    save_as_published(hf, path)
    return Pair(hf, LLM(path, cpu=True, dtype="float32", max_num_seqs=8), path, request.param)


def test_detected_config(pair):
    cfg = pair.llm.config
    assert layer_kinds(cfg) == ["deltanet+mlp"] * 3 + ["attention+mlp"]
    dn = cfg.layers[0].mixer(GatedDeltaNetConfig)
    assert (dn.num_k_heads, dn.num_v_heads, dn.head_k_dim, dn.head_v_dim, dn.beta_scale) == (
        2,
        4,
        16,
        24,
        2.0,
    )
    attn = cfg.layers[3].mixer(AttentionConfig)
    assert (
        not attn.is_qk_norm_per_head
        and not attn.has_output_gate
        and (attn.rope is None) == (pair.name == "nope")
    )
    assert (
        cfg.layers[3].norm is None and cfg.layers[3].post_norm is not None and cfg.layers[0].post_norm is None
    )
    assert pair.llm.runner.decode_plan is not None  # post-norms and the full-width q/k norm are kernel ops


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_prefix_cache_on_equals_off(pair):
    """A shared prefix of 3 blocks and a repeat: the cached run resumes from the DeltaNet snapshots and the
    attention blocks, with the uncached run's tokens and logprobs."""
    from blazr.config import EngineConfig

    def load(is_cached: bool) -> LLM:
        engine = EngineConfig(
            max_num_seqs=4, max_model_len=256, block_size=16, enable_prefix_caching=is_cached,
            state_snapshot_interval=2, cache_memory_gib=0.1,
        )  # fmt: skip
        return LLM(pair.path, cpu=True, dtype="float32", engine_config=engine)

    on, off = load(True), load(False)
    shared = prompts([50], seed=8, vocab=1024)[0]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1, ignore_eos=True)
    batch = [[*shared, 7, 8, 9], [*shared, 10, 11]]
    for _ in range(2):
        got, want = on.generate(batch, params), off.generate(batch, params)
        for a, b in zip(got, want, strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
            x = torch.tensor([lp.logprob for lp in a.outputs[0].logprobs])
            y = torch.tensor([lp.logprob for lp in b.outputs[0].logprobs])
            torch.testing.assert_close(x, y, atol=1e-4, rtol=0)
    assert [r.num_cached_tokens for r in got] == [48, 48]


def test_quantize_int8(pair):
    """`--quantize int8`: the DeltaNet's separate projections joined into its quantized in_proj_qkvz /
    in_proj_ba by address; cached schedules agree with the cacheless forward; batched == alone."""
    from blazr.kernels import q8_packed
    from blazr.kernels.quant import quantize
    from blazr.model.qlinear import QuantizedLinear

    llm = LLM(pair.path, cpu=True, dtype="float32", quantize="int8", max_num_seqs=4)
    kind = q8_packed.runs_as()  # the layout a GGUF's Q8_0 runs as here
    for name in ("layers.0.deltanet.in_proj_qkvz", "layers.0.deltanet.in_proj_ba", "layers.3.attn.qkv_proj"):
        got, want = llm.model.get_submodule(name), pair.llm.model.get_submodule(name).weight.detach()
        assert isinstance(got, QuantizedLinear) and got.kind == kind
        assert torch.equal(got.qweight.data, quantize(want, kind).data)
    check_cache_invariants(llm, 0.15)  # 8-bit activations on these sensitive models (test_hf_qwen3_next)
    check_batched_equals_alone(llm)


def test_two_ranks_give_one_ranks_tokens_and_logprobs(pair):
    """Tensor parallel 2 == 1: the DeltaNet layers split by key heads (their q / k / v convs with them), the
    attention by heads with its all-heads q/k norm's mean of squares all-reduced — the same greedy tokens and
    logprobs within float32 rounding."""
    from tests.test_tensor_parallel import check_two_ranks_match_one

    check_two_ranks_match_one(pair.path)


def test_without_config_json(tmp_path):
    """No config.json: the tensor names say OLMo-Hybrid; heads come from the common head size (64: 2 heads
    and 1 KV head here), the DeltaNet's from its projections and A_log; NoPE and β in (0, 2), as the
    released checkpoints — the same model as with it."""
    import transformers

    from tests.ssm_fixtures import detect_with, runtime_free

    sizes = {**TINY, **SIZES, "num_attention_heads": 2, "num_key_value_heads": 1}
    cfg = transformers.OlmoHybridConfig(**sizes)
    cfg.rope_parameters = None
    torch.manual_seed(0)
    hf = transformers.OlmoHybridForCausalLM(cfg).float().eval()
    randomise(hf, 1)
    save_as_published(hf, tmp_path / "with")
    llm = LLM(tmp_path / "with", cpu=True, dtype="float32", max_num_seqs=2)
    assert runtime_free(detect_with(tmp_path / "with", tmp_path / "without", None)) == runtime_free(
        llm.config
    )
    other = LLM(tmp_path / "without", cpu=True, dtype="float32", max_num_seqs=2)
    batch = prompts([13], seed=7, vocab=1024)
    assert torch.equal(full_logits(other.runner, batch)[0], full_logits(llm.runner, batch)[0])
