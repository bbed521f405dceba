"""oxidizr checkpoints: detection with and without config.json, each layer against an independent oracle
(HF Mamba2Mixer, HF MixtralSparseMoeBlock + shared MLP, a transcription of spec §5.4 for MLA, HF
LlamaForCausalLM for the GQA-only model), and the whole-model cache invariants."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from blazr import LLM, SamplingParams
from blazr.info import describe
from blazr.state.batch import ForwardBatch
from tests.drive import assert_logits_close, chunked, full_logits, stepwise_logits
from tests.oxidizr_fixtures import GQA_ONLY, NANO, NANO_START, OxSizes, write_oxidizr
from tests.ssm_fixtures import runtime_free

SHAPES = {"nano-start": NANO_START, "nano": NANO, "gqa-only": GQA_ONLY}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each shape written once (with and without config.json) and loaded once, on first use."""
    loaded = {}

    def get(name: str):
        if name not in loaded:
            sizes = SHAPES[name]
            root = tmp_path_factory.mktemp(name)
            f = write_oxidizr(root / "with-config", sizes, with_config=True)
            write_oxidizr(root / "no-config", sizes, with_config=False)
            loaded[name] = sizes, root, load_file(f), LLM(root / "with-config", cpu=True)
        return loaded[name]

    return get


@pytest.fixture(params=list(SHAPES))
def ox(request, checkpoints):
    return checkpoints(request.param)


@pytest.fixture(params=["nano-start", "nano"])
def ox_hybrid(request, checkpoints):
    return checkpoints(request.param)


def test_same_config_with_and_without_config_json(ox):
    sizes, root, _, llm = ox
    inferred = LLM(root / "no-config", cpu=True)
    assert runtime_free(inferred.config) == runtime_free(llm.config)
    expected = {"Mamba2": "mamba2", "MlaWithMoe": "mla+moe", "Standard": "attention+mlp"}
    assert [layer.kind for layer in llm.config.layers] == [expected[k] for k in sizes.layers]
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    assert torch.equal(full_logits(inferred.runner, prompt)[0], full_logits(llm.runner, prompt)[0])


def test_mamba2_mixer_equals_hf(ox_hybrid):
    sizes, _, tensors, llm = ox_hybrid
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    hf_cfg = Mamba2Config(
        hidden_size=sizes.hidden,
        num_heads=sizes.mamba_heads,
        head_dim=sizes.mamba_head_dim,
        state_size=sizes.state,
        n_groups=sizes.groups,
        expand=sizes.mamba_heads * sizes.mamba_head_dim // sizes.hidden,
        conv_kernel=sizes.conv_kernel,
        chunk_size=sizes.chunk,
        use_bias=True,
        use_conv_bias=True,
        time_step_limit=(0.001, 0.1),
        layer_norm_epsilon=1e-6,
    )
    hf = Mamba2Mixer(hf_cfg, layer_idx=0).eval()
    prefix = "layers.0.mamba2.mixer."
    hf.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
    x = torch.randn(1, 37, sizes.hidden, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(x)[0]
        ours = llm.model.layers[0].mamba(x[0], ForwardBatch.prefill([37]), None)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


def _moe_layer(sizes: OxSizes) -> int:
    return sizes.layers.index("MlaWithMoe")


def test_routed_moe_equals_mixtral_block_plus_shared_mlp(ox_hybrid):
    sizes, _, tensors, llm = ox_hybrid
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    i = _moe_layer(sizes)
    p = f"layers.{i}.moe."
    block = MixtralSparseMoeBlock(
        MixtralConfig(
            hidden_size=sizes.hidden,
            intermediate_size=sizes.intermediate,
            num_local_experts=sizes.experts,
            num_experts_per_tok=sizes.experts_per_tok,
        )
    ).eval()
    experts = range(sizes.experts)
    block.load_state_dict(
        {
            "gate.weight": tensors[p + "router.gate.weight"],
            "experts.gate_up_proj": torch.stack(
                [
                    torch.cat(
                        [
                            tensors[f"{p}experts.{e}.gate_proj.weight"],
                            tensors[f"{p}experts.{e}.up_proj.weight"],
                        ]
                    )
                    for e in experts
                ]
            ),
            "experts.down_proj": torch.stack([tensors[f"{p}experts.{e}.down_proj.weight"] for e in experts]),
        }
    )
    x = torch.randn(1, 29, sizes.hidden, generator=torch.Generator().manual_seed(1))
    s = p + "shared_expert."
    shared = F.linear(
        F.silu(F.linear(x, tensors[s + "gate_proj.weight"])) * F.linear(x, tensors[s + "up_proj.weight"]),
        tensors[s + "down_proj.weight"],
    )
    with torch.no_grad():
        ref = block(x) + shared
        ours = llm.model.layers[i].moe(x[0])
    torch.testing.assert_close(ours, ref[0], atol=1e-5, rtol=1e-4)


def _spec_mla(t: dict[str, torch.Tensor], p: str, x: torch.Tensor, sizes: OxSizes) -> torch.Tensor:
    """Spec §5.4, transcribed: x [T, H] (the RMS_in output) → MLA output [T, H]."""
    T, nh, r = x.shape[0], sizes.heads, sizes.d_rope
    hd = sizes.hidden // nh
    c_kv = x @ t[p + "w_dkv.weight"].T
    c_q = x @ t[p + "w_dq.weight"].T
    q_r = (x @ t[p + "w_qr.weight"].T).view(T, nh, r)
    k_r = x @ t[p + "w_kr.weight"].T  # [T, r], shared by all heads
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, r, 2).float() / r))
    angle = torch.arange(T).float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()

    def rope(v: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        rot = torch.cat([-v[..., r // 2 :], v[..., : r // 2]], -1)
        return v * c + rot * s

    q_r = rope(q_r, cos[:, None], sin[:, None])
    k_r = rope(k_r, cos, sin)
    q_c = (c_q @ t[p + "w_uq.weight"].T).view(T, nh, hd)
    k_c = (c_kv @ t[p + "w_uk.weight"].T).view(T, nh, hd)
    v = (c_kv @ t[p + "w_uv.weight"].T).view(T, nh, hd)
    q = torch.cat([q_c, q_r], -1)
    k = torch.cat([k_c, k_r[:, None].expand(T, nh, r)], -1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd + r)
    scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    o = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(T, nh * hd)
    return o @ t[p + "o_proj.weight"].T


def test_mla_equals_spec_transcription(ox_hybrid):
    sizes, _, tensors, llm = ox_hybrid
    i = _moe_layer(sizes)
    x = torch.randn(23, sizes.hidden, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = llm.model.layers[i].mla(x, ForwardBatch.prefill([23]), None)
    torch.testing.assert_close(
        ours, _spec_mla(tensors, f"layers.{i}.self_attn.", x, sizes), atol=2e-5, rtol=1e-4
    )


def test_gqa_only_equals_llama_after_renames(checkpoints):
    sizes, _, tensors, llm = checkpoints("gqa-only")
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=sizes.vocab,
            hidden_size=sizes.hidden,
            intermediate_size=sizes.intermediate,
            num_hidden_layers=len(sizes.layers),
            num_attention_heads=sizes.heads,
            num_key_value_heads=sizes.kv_heads,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            max_position_embeddings=sizes.max_seq_len,
        )
    ).eval()
    renamed = {("lm_head.weight" if k == "lm_head.weight" else "model." + k): v for k, v in tensors.items()}
    hf.load_state_dict(renamed)
    ids = [random.Random(3).randrange(sizes.vocab) for _ in range(40)]
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0]
    assert_logits_close(full_logits(llm.runner, [ids])[0], ref)


@pytest.mark.parametrize("plan", ["prefill+steps", "chunk7", "chunk64"])
def test_whole_model_cache_invariants(ox, plan):
    sizes, _, _, llm = ox
    rng = random.Random(4)
    prompts = [[rng.randrange(sizes.vocab) for _ in range(n)] for n in (90, 41, 13)]
    if plan == "prefill+steps":
        chunks = [[len(p) - 12] + [1] * 12 for p in prompts]
    else:
        chunks = [chunked(len(p), 7 if plan == "chunk7" else 64) for p in prompts]
    for got, want in zip(
        stepwise_logits(llm, prompts, chunks), full_logits(llm.runner, prompts), strict=True
    ):
        assert_logits_close(got, want)


def test_batched_generation_equals_each_alone(ox):
    sizes, _, _, llm = ox
    rng = random.Random(5)
    prompts = [[rng.randrange(sizes.vocab) for _ in range(n)] for n in (5, 33, 17, 60)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    together = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert together == [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]


def test_cache_bytes_from_allocated_tensors(ox):
    sizes, _, _, llm = ox
    cache = llm.runner.cache
    mla_bytes = sum(
        lc.latent[0].numel() * lc.latent.element_size() for lc in cache.layers if hasattr(lc, "latent")
    )
    num_mla = sizes.layers.count("MlaWithMoe")
    assert mla_bytes == (sizes.kv_latent + sizes.d_rope) * 4 * num_mla
    info = describe(llm.checkpoint)
    per_token = sum(t[0].numel() * t.element_size() for t in cache.paged)
    assert info["cache"]["kv_bytes_per_token"] == per_token
    state = sum(t[0].numel() * t.element_size() for t in cache.state)
    assert info["cache"]["state_bytes_per_sequence"] == state
    assert info["layer_kinds"] == [layer.kind for layer in llm.config.layers]
