"""Checkpoint discovery and loading: file layouts (single file of any name, shards + index, HF repo id
from the local cache) and the one-line errors for every broken input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from blazr import LLM
from blazr.detect import find_weight_files, inspect_checkpoint, resolve_model_path
from blazr.errors import BlazrError, CheckpointError, UnsupportedError
from blazr.kernels import q8_packed
from blazr.model.skeleton import NoInit
from blazr.tokenizer import TokenizerSource, load_tokenizer
from tests.drive import full_logits
from tests.tiny import build


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    build("LlamaForCausalLM", path)
    return path


def _logits(path, ids=(1, 2, 3, 4, 5)) -> torch.Tensor:
    return full_logits(LLM(path, cpu=True).runner, [list(ids)])[0]


def test_single_file_with_any_name(tiny, tmp_path):
    shutil.copy(tiny / "model.safetensors", tmp_path / "my_run_final.safetensors")
    shutil.copy(tiny / "config.json", tmp_path / "config.json")
    assert find_weight_files(tmp_path) == ("safetensors", [tmp_path / "my_run_final.safetensors"])
    assert torch.equal(_logits(tmp_path / "my_run_final.safetensors"), _logits(tiny))


def test_sharded_checkpoint_with_index(tiny, tmp_path):
    tensors = load_file(tiny / "model.safetensors")
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for i, part in enumerate(halves, start=1):
        fname = f"model-{i:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, tmp_path / fname)
        weight_map.update({n: fname for n in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(tiny / "config.json", tmp_path / "config.json")
    assert torch.equal(_logits(tmp_path), _logits(tiny))


def test_hf_repo_id_resolved_from_local_cache(tiny, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for f in ("model.safetensors", "config.json"):
        shutil.copy(tiny / f, snapshot / f)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    assert resolve_model_path("acme/tiny-llama") == snapshot
    assert torch.equal(_logits("acme/tiny-llama"), _logits(tiny))
    with pytest.raises(CheckpointError, match="acme/missing"):
        resolve_model_path("acme/missing")


# ------------------------------------------------------------------------------------------- errors


def test_path_missing():
    with pytest.raises(CheckpointError, match="model path not found: /no/such/dir"):
        resolve_model_path("/no/such/dir")


def test_no_weights_in_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        CheckpointError, match=r"no weights in .*expected model\.safetensors.*found \['config\.json'\]"
    ):
        inspect_checkpoint(tmp_path)


def test_truncated_safetensors(tiny, tmp_path):
    data = (tiny / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt or truncated safetensors"):
        inspect_checkpoint(tmp_path)


def test_truncated_gguf(tmp_path):
    from blazr.detect import default_model_path

    data = default_model_path().read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=r"cut\.gguf"):
        inspect_checkpoint(tmp_path / "cut.gguf")


def test_wrong_tensor_shape(tiny, tmp_path):
    tensors = load_file(tiny / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(200, 128)
    save_file(tensors, tmp_path / "model.safetensors")
    shutil.copy(tiny / "config.json", tmp_path / "config.json")
    with pytest.raises(
        CheckpointError,
        match=r"tensor model\.layers\.1\.mlp\.up_proj\.weight .*"
        r"expected shape \[256, 128\], found \[200, 128\]",
    ):
        LLM(tmp_path, cpu=True)


def test_missing_tensor(tiny, tmp_path):
    tensors = load_file(tiny / "model.safetensors")
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    shutil.copy(tiny / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.0\.self_attn\.k_proj\.weight"):
        LLM(tmp_path, cpu=True)


def test_config_tensor_mismatch_names_the_tensor(tiny, tmp_path):
    shutil.copy(tiny / "model.safetensors", tmp_path / "model.safetensors")
    cfg = json.loads((tiny / "config.json").read_text())
    cfg["intermediate_size"] = 512
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError, match=r"gate_proj\.weight .*expected shape \[512, 128\], found \[256, 128\]"
    ):
        LLM(tmp_path, cpu=True)


def test_unsupported_architecture_lists_supported(tiny, tmp_path):
    shutil.copy(tiny / "model.safetensors", tmp_path / "model.safetensors")
    cfg = json.loads((tiny / "config.json").read_text())
    cfg["architectures"] = ["GPTBigCodeForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        UnsupportedError,
        match=r"unsupported architecture GPTBigCodeForCausalLM; supported: .*LlamaForCausalLM",
    ):
        inspect_checkpoint(tmp_path)


def test_unknown_vocab():
    with pytest.raises(BlazrError, match=r"unknown vocab.*cl100k_base"):
        load_tokenizer(TokenizerSource(vocab_name="no_such_vocab"))


def test_embedded_load_does_not_import_dynamo():
    """Loading the default model, recording its decode plan, counting its parameters for the model listings
    (the server's start) and describing it (`blazr info`) never import torch._dynamo (~3 s of CPU, more than
    the load): each model is built on meta without torch.nn.init (model/skeleton.py) and the capture's
    dispatch mode opts out of torch's dynamo-disable wrapper (kernels/capture.py); nor the gguf package
    (0.15 s: the header is parsed by loading/gguf_header.py). Fresh process: the test session itself may
    have imported them."""
    code = (
        "import sys, blazr\n"
        "llm = blazr.LLM(cpu=True, max_model_len=256, max_num_seqs=1)\n"
        "assert llm.runner.decode_plan is not None, 'the decode plan was not captured'\n"
        "assert sum(p.device.type == 'meta' for p in llm.runner.model.parameters()) == 0\n"
        "assert llm.details()['parameter_count'] > 100_000_000\n"  # the listings' count (server start)
        "from blazr.info import describe\n"
        "assert describe(llm.checkpoint)['num_layers'] == 30\n"  # `blazr info`
        "print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo')\n"
        "print('gguf' if 'gguf' in sys.modules else 'no gguf')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["no dynamo", "no gguf"]  # gguf: loading/gguf_header.py


def test_meta_build_skips_init_only_on_meta():
    """NoInit leaves torch.nn.init alone on real tensors (a module built outside meta is initialised)."""
    with NoInit():
        w = torch.nn.init.normal_(torch.zeros(64), std=1.0)
        lin = torch.nn.Linear(8, 8)
    assert w.abs().sum() > 0 and lin.weight.abs().sum() > 0
    with torch.device("meta"), NoInit():
        assert torch.nn.Embedding(10, 4).weight.device.type == "meta"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("mode", "kind"), [("int8", "q8_0g"), ("int4", "q4_1")])
def test_in_situ_quantize_reads_rows_in_place_and_gives_ggufs_bytes(
    tiny, tmp_path, monkeypatch, mode, kind, dtype
):
    """`--quantize int8|int4` quantizes each linear straight from the rows of the checkpoint's map (the C
    quantizer reads bf16 / f16 / f32 rows in place: no float tensor, fused q|k|v and gate|up never
    gathered) and every quantized layer holds gguf's bytes for the weight's float32 values; so does the token
    table (Q8_0 rows in ggml's order, in the 4-bit mode too), and a tied head is read in place as well."""
    import gguf

    from blazr.kernels import ops
    from blazr.model.qlinear import QuantizedLinear

    tensors = {k: v.to(dtype) for k, v in load_file(tiny / "model.safetensors").items()}
    save_file(tensors, tmp_path / "model.safetensors")
    shutil.copy(tiny / "config.json", tmp_path / "config.json")
    seen, real = [], ops.Kernels.quantize_rows
    monkeypatch.setattr(ops.Kernels, "quantize_rows", lambda self, *a: seen.append(a[2]) or real(self, *a))
    llm = LLM(tmp_path, cpu=True, dtype="float32", quantize=mode)
    layers = {n: m for n, m in llm.runner.model.named_modules() if isinstance(m, QuantizedLinear)}
    linear_kind = q8_packed.runs_as() if mode == "int8" else kind
    # int8: the head q8_0g, the other linears the layout a GGUF's Q8_0 runs as here (the same values)
    kinds = {n: "q8_0g" if mode == "int8" and n == "lm_head" else linear_kind for n in layers}
    assert {n: m.qweight.kind for n, m in layers.items()} == kinds
    assert len(seen) == len(layers) + 1 > 9  # + the table
    assert set(seen) == {dtype}
    ggml = {"q8_0g": gguf.GGMLQuantizationType.Q8_0, "q4_1": gguf.GGMLQuantizationType.Q4_1}[kind]
    table = tensors["model.embed_tokens.weight"].float().numpy()
    want_table = gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(llm.runner.model.embed_tokens.table.data.numpy(), want_table)
    p = "model.layers.0."
    expected = {
        "layers.0.attn.qkv_proj": [p + f"self_attn.{x}_proj.weight" for x in "qkv"],
        "layers.0.attn.o_proj": [p + "self_attn.o_proj.weight"],
        "layers.0.mlp.gate_up_proj": [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
        "layers.0.mlp.down_proj": [p + "mlp.down_proj.weight"],
    }
    for name, sources in expected.items():
        w = torch.cat([tensors[s].float() for s in sources])
        want = torch.from_numpy(gguf.quants.quantize(w.numpy(), ggml)).view(torch.uint8)
        assert torch.equal(layers[name].qweight.ggml_blocks(), want.reshape(w.shape[0], -1)), name
