"""Models by name: `org/name[:QUANT]` selection, `blazr pull` / `ls` / `rm`, and `--model org/name:QUANT`.

No hub is reachable from CI or these machines, so the hub's routes (model info, HEAD/GET resolve, a CDN on
another port with Range support) are served locally by tests/hub_server.py over temp-dir repositories:
a GGUF repository with several quants (tiny real GGUFs the tests load), a split quant, sidecars; one
without Q4_K_M; a safetensors repository with junk beside its weights. In-process tests point
huggingface_hub's constants (ENDPOINT, HF_HUB_CACHE, HF_HUB_OFFLINE) at the server and a temp cache; the
end-to-end tests run `blazr` in subprocesses with HF_ENDPOINT and HF_HOME set.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from blazr import LLM, SamplingParams
from blazr.cli import main
from blazr.detect import find_weight_files, inspect_checkpoint, resolve_model_path
from blazr.errors import CheckpointError
from blazr.hub.names import ModelName, looks_like_name, parse_name, select_files
from blazr.hub.pull import pull
from tests.gguf_fixtures import write_tiny_llama_gguf
from tests.hub_server import HubServer
from tests.test_gguf import TINY, tiny_state_dict
from tests.tiny import build

GGUF_REPO = "test-org/tiny-GGUF"
VOCAB = [*"abcdefghijklmnopqrstuvwxyz0123456789", "<s>", "</s>", "!", "?"]  # 40 = TINY's vocab_size


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub-repos")
    gg = root / GGUF_REPO
    (gg / "Q2_K").mkdir(parents=True)
    state = tiny_state_dict()
    merges = {"tokenizer.ggml.merges": ["a b", "c d"]}
    write_tiny_llama_gguf(gg / "tiny-Q4_K_M.gguf", state, TINY, "Q8_0", VOCAB, merges)
    write_tiny_llama_gguf(gg / "tiny-Q8_0.gguf", state, TINY, "Q8_0", VOCAB, merges)
    write_tiny_llama_gguf(gg / "tiny-F16.gguf", state, TINY, "F16", VOCAB, merges)
    # a split quant (its bytes are Q8_0's, as llama.cpp's gguf-split lays parts out: metadata in the first)
    names = list(state)
    split = {"split.count": 2, "split.tensors.count": len(names)}
    first, rest = {n: state[n] for n in names[:8]}, {n: state[n] for n in names[8:]}
    part = "Q2_K/tiny-Q2_K-0000{}-of-00002.gguf"
    write_tiny_llama_gguf(gg / part.format(1), first, TINY, "Q8_0", VOCAB, {**merges, **split, "split.no": 0})
    write_tiny_llama_gguf(gg / part.format(2), rest, TINY, "Q8_0", metadata={**split, "split.no": 1})
    (gg / "mmproj-tiny-F16.gguf").write_bytes(b"projector" * 100)
    (gg / "README.md").write_text("# tiny\n")
    noq4 = root / "test-org/noq4-GGUF"
    noq4.mkdir(parents=True)
    for f in ("m-Q5_K_M.gguf", "m-Q8_0.gguf", "m-IQ4_XS.gguf"):
        (noq4 / f).write_bytes(f.encode() * 50)
    st = root / "test-org/tiny"
    build("LlamaForCausalLM", st, vocab_size=128)
    (st / "tokenizer_config.json").write_text("{}")
    (st / "chat_template.jinja").write_text("{{ messages }}")
    for junk in (
        "pytorch_model.bin",
        "original/consolidated.00.pth",
        "onnx/model.onnx",
        "flax_model.msgpack",
    ):
        (st / junk).parent.mkdir(exist_ok=True)
        (st / junk).write_bytes(b"junk" * 1000)
    (st / "README.md").write_text("# tiny safetensors\n")
    return root


@pytest.fixture
def hub(repos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The local hub, with huggingface_hub pointed at it and at a fresh cache."""
    server = HubServer(repos)
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server
    server.close()


def downloaded(server: HubServer) -> set[str]:
    """Repository paths whose bytes were fetched (resolve GETs of small files, CDN GETs of LFS ones)."""
    out = set()
    for method, path, _ in server.requests:
        if method == "GET" and "/resolve/" in path:
            out.add(path.split("/resolve/", 1)[1].split("/", 1)[1])
        elif method == "GET" and path.startswith("/cdn/"):
            out.add(path.split("/", 4)[4])
    return out


# ------------------------------------------------------------------------------------------------ names


def test_names_parse_and_reject_bad_ones():
    assert parse_name("org/name") == ModelName("org/name", None)
    assert parse_name("bartowski/Qwen3-0.6B-GGUF:q4_k_m") == ModelName("bartowski/Qwen3-0.6B-GGUF", "q4_k_m")
    assert parse_name("unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL").quant == "UD-Q4_K_XL"
    assert (
        looks_like_name("org/name:Q8_0")
        and not looks_like_name("./org/name")
        and not looks_like_name("a/b/c")
    )
    for bad in ("org/name:", "org/", "/abs/path", "org/name:Q4 K", "a/b/c:Q8_0"):
        with pytest.raises(CheckpointError, match="expected org/name or org/name:QUANT"):
            parse_name(bad)


def test_gguf_selection_follows_llama_cpp():
    files = [
        "README.md", "mmproj-m-F16.gguf", "m-F16.gguf", "m-Q4_K_M.gguf", "m.Q8_0.gguf",
        "m-UD-Q4_K_XL.gguf", "m-IQ4_XS.gguf", "Q6_K/m-Q6_K-00002-of-00002.gguf",
        "Q6_K/m-Q6_K-00001-of-00002.gguf", "m-imatrix.gguf",
    ]  # fmt: skip
    sel = lambda q: select_files(ModelName("o/m", q), files)
    assert sel(None).files == ("m-Q4_K_M.gguf",) and sel(None).primary == "m-Q4_K_M.gguf"
    assert sel("q8_0").files == ("m.Q8_0.gguf",)  # case-insensitive, `.` before the tag
    assert sel("UD-Q4_K_XL").files == sel("Q4_K_XL").files == ("m-UD-Q4_K_XL.gguf",)
    assert sel("iq4_xs").files == ("m-IQ4_XS.gguf",)
    six = sel("Q6_K")  # a split in a quant folder: every part, the first first
    assert six.files == ("Q6_K/m-Q6_K-00001-of-00002.gguf", "Q6_K/m-Q6_K-00002-of-00002.gguf")
    assert six.primary == six.files[0]
    assert sel("f16").files == ("m-F16.gguf",)  # never the projector
    with pytest.raises(CheckpointError) as e:
        sel("Q3_K_S")
    assert str(e.value) == "o/m has no Q3_K_S GGUF; quants there: Q6_K, F16, IQ4_XS, Q4_K_M, Q4_K_XL, Q8_0"
    no_q4 = ["x-Q5_K_M.gguf", "x-Q8_0.gguf", "mmproj-x-F16.gguf"]
    assert select_files(ModelName("o/x"), no_q4).files == ("x-Q8_0.gguf",)  # llama-server: Q4_K_M, Q8_0
    assert select_files(ModelName("o/x"), ["x-Q5_K_M.gguf", "x-Q6_K.gguf"]).files == ("x-Q5_K_M.gguf",)
    with pytest.raises(CheckpointError, match="part 1 of 2 but 1 parts"):
        select_files(ModelName("o/m", "Q6_K"), ["Q6_K/m-Q6_K-00001-of-00002.gguf"])


def test_safetensors_selection_skips_everything_else():
    files = [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "config.json", "generation_config.json", "tokenizer.json",
        "tokenizer_config.json", "chat_template.jinja",
        "special_tokens_map.json", "tokenizer.model", "pytorch_model.bin", "original/consolidated.00.pth",
        "onnx/model.onnx", "original/params.json", "README.md", ".gitattributes",
    ]  # fmt: skip
    sel = select_files(ModelName("o/s"), files)
    assert sel.kind == "safetensors" and sel.primary is None
    assert set(sel.files) == set(files[:10])
    with pytest.raises(CheckpointError, match=r"has no GGUF files .* use o/s without :Q4_K_M"):
        select_files(ModelName("o/s", "Q4_K_M"), files)


# ------------------------------------------------------------------------------------------------- pull


def test_pull_fetches_only_the_default_quant(hub: HubServer, repos: Path):
    pulled = pull(GGUF_REPO)
    assert pulled.path.name == "tiny-Q4_K_M.gguf" and pulled.selection.quant == "Q4_K_M"
    assert pulled.path.read_bytes() == (repos / GGUF_REPO / "tiny-Q4_K_M.gguf").read_bytes()
    assert pulled.size == pulled.path.stat().st_size
    assert downloaded(hub) == {"tiny-Q4_K_M.gguf"}
    assert inspect_checkpoint(pulled.path, vocab_name=None).format == "gguf"
    before = len(hub.requests)
    assert resolve_model_path(GGUF_REPO) == pulled.path  # cache first: no request at all
    assert len(hub.requests) == before
    again = pull(f"{GGUF_REPO}:q4_k_m")  # `pull` lists the repository again, fetches nothing
    assert again.path == pulled.path and downloaded(hub) == {"tiny-Q4_K_M.gguf"}


def test_missing_quant_lists_the_quants_and_downloads_nothing(hub: HubServer):
    with pytest.raises(CheckpointError) as e:
        resolve_model_path(f"{GGUF_REPO}:Q3_K_S")
    assert str(e.value) == f"{GGUF_REPO} has no Q3_K_S GGUF; quants there: Q2_K, F16, Q4_K_M, Q8_0"
    assert downloaded(hub) == set()
    with pytest.raises(CheckpointError, match="no repository test-org/absent on http://127"):
        pull("test-org/absent:Q8_0")


def test_default_without_q4_k_m_is_q8_0_with_a_progress_bar_when_asked(hub: HubServer, capfd, monkeypatch):
    monkeypatch.setenv("BLAZR_PROGRESS_DELAY", "0")  # a bar however quick the transfer
    assert pull("test-org/noq4-GGUF", show=True).path.name == "m-Q8_0.gguf"
    assert downloaded(hub) == {"m-Q8_0.gguf"}
    bar = capfd.readouterr().err  # the bar (`blazr pull` asks it on a terminal); redraws depend on timing
    assert bar.startswith("\rm-Q8_0.gguf:") and "/550 [" in bar
    pull("test-org/noq4-GGUF:Q5_K_M")
    assert capfd.readouterr().err == ""  # quiet otherwise


def test_safetensors_repository_gets_weights_configs_tokenizer_template_only(hub: HubServer):
    pulled = pull("test-org/tiny")
    assert pulled.path.is_dir() and pulled.selection.kind == "safetensors"
    wanted = {"model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json"}
    assert downloaded(hub) == wanted | {"chat_template.jinja"}
    touched = {p for _, p, _ in hub.requests}
    assert not any(
        j in p for p in touched for j in ("pytorch_model", "original/", "onnx", "msgpack", "README")
    )
    assert find_weight_files(pulled.path) == ("safetensors", [pulled.path / "model.safetensors"])
    assert resolve_model_path("test-org/tiny") == pulled.path


def test_a_split_gguf_downloads_every_part_and_loads(hub: HubServer):
    pulled = pull(f"{GGUF_REPO}:Q2_K")
    assert [p.rsplit("/", 1)[-1] for p in pulled.selection.files] == [
        "tiny-Q2_K-00001-of-00002.gguf",
        "tiny-Q2_K-00002-of-00002.gguf",
    ]
    assert downloaded(hub) == set(pulled.selection.files)
    assert pulled.path.name == "tiny-Q2_K-00001-of-00002.gguf"
    ckpt = inspect_checkpoint(pulled.path, vocab_name=None)
    assert [p.name for p in ckpt.weight_files] == [p.rsplit("/", 1)[-1] for p in pulled.selection.files]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    tokens = LLM(pulled.path, cpu=True).generate([[3, 1, 4, 1, 5]], params)[0].outputs[0].token_ids
    same = LLM(pull(f"{GGUF_REPO}:Q8_0").path, cpu=True).generate([[3, 1, 4, 1, 5]], params)[0]
    assert tokens == same.outputs[0].token_ids  # the same tensors as the one-file Q8_0


def test_a_dropped_transfer_resumes_with_a_range(hub: HubServer, repos: Path):
    """The connection drops half-way: the same pull asks the rest (Range) and the file is whole."""
    hub.state.drop_once.add(f"/cdn/{GGUF_REPO}/tiny-Q8_0.gguf")
    pulled = pull(f"{GGUF_REPO}:Q8_0")
    data = (repos / GGUF_REPO / "tiny-Q8_0.gguf").read_bytes()
    assert pulled.path.read_bytes() == data
    gets = hub.cdn_gets()
    assert [r for _, r in gets] == [None, f"bytes={len(data) // 2}-"]


def test_an_interrupted_pull_is_resumed_by_the_next(hub: HubServer, repos: Path):
    """The connection drops half-way and the hub then refuses: the pull fails, keeping the half it has;
    the next pull asks only the rest."""
    hub.state.drop_once.add(f"/cdn/{GGUF_REPO}/tiny-F16.gguf")
    hub.state.refuse_after_drop = True
    with pytest.raises(CheckpointError, match=r"run the same command again to resume|run again to resume"):
        pull(f"{GGUF_REPO}:F16")
    data = (repos / GGUF_REPO / "tiny-F16.gguf").read_bytes()
    partial = list(Path(constants.HF_HUB_CACHE).rglob("*.incomplete"))
    assert len(partial) == 1 and partial[0].stat().st_size == len(data) // 2
    hub.state.refuse = hub.state.refuse_after_drop = False
    del hub.requests[:]
    pulled = pull(f"{GGUF_REPO}:F16")
    assert pulled.path.read_bytes() == data
    assert [r for _, r in hub.cdn_gets()] == [f"bytes={len(data) // 2}-"]
    assert not list(Path(constants.HF_HUB_CACHE).rglob("*.incomplete"))


def test_offline_resolves_from_the_cache_and_says_what_is_cached(hub: HubServer, monkeypatch):
    pull(f"{GGUF_REPO}:Q8_0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    del hub.requests[:]
    assert resolve_model_path(f"{GGUF_REPO}:q8_0").name == "tiny-Q8_0.gguf"
    assert resolve_model_path(GGUF_REPO).name == "tiny-Q8_0.gguf"  # no quant: the cached one
    assert LLM(f"{GGUF_REPO}:Q8_0", cpu=True).path.name == "tiny-Q8_0.gguf"
    assert hub.requests == []
    with pytest.raises(CheckpointError) as e:
        resolve_model_path(f"{GGUF_REPO}:F16")
    assert "not in the Hugging Face cache" in str(e.value) and "HF_HUB_OFFLINE is set" in str(e.value)
    assert str(e.value).endswith("cached quants: Q8_0")
    with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE is set; nothing of it is cached"):
        resolve_model_path("test-org/noq4-GGUF")
    assert hub.requests == []


def test_an_unreachable_hub_falls_back_to_the_cache(hub: HubServer, monkeypatch):
    pull(f"{GGUF_REPO}:Q8_0")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed}")
    with pytest.raises(
        CheckpointError, match=r"the hub at http://127.* is unreachable .*cached quants: Q8_0"
    ):
        resolve_model_path(f"{GGUF_REPO}:F16")
    assert resolve_model_path(GGUF_REPO).name == "tiny-Q8_0.gguf"


# --------------------------------------------------------------------------------------- pull / ls / rm


def test_ls_and_rm(hub: HubServer, tmp_path: Path, monkeypatch, capsys):
    quant_dir = tmp_path / "quantized"
    quant_dir.mkdir()
    (quant_dir / "tiny-int8-0123456789abcdef.blzq").write_bytes(b"q" * 3000)
    monkeypatch.setenv("BLAZR_QUANT_CACHE", str(quant_dir))
    assert main(["pull", f"{GGUF_REPO}:Q8_0"]) == 0
    assert main(["pull", GGUF_REPO]) == 0
    assert main(["pull", "test-org/tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{GGUF_REPO}:Q8_0\tgguf\t1 file, ") and out[0].endswith("tiny-Q8_0.gguf")
    assert out[2].startswith("test-org/tiny\tsafetensors\t5 files, ")
    assert main(["pull", "test-org/tiny:Q4 K"]) == 1
    assert capsys.readouterr().err.startswith("error: bad model name 'test-org/tiny:Q4 K': expected org/name")
    assert main(["rm"]) == 1
    assert "error: rm: name a model" in capsys.readouterr().err

    assert main(["ls"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["NAME", "KIND", "SIZE", "PATH"]
    names = {r[0]: r for r in rows[1:]}
    blzq = "tiny-int8-0123456789abcdef.blzq"
    assert set(names) == {f"{GGUF_REPO}:Q4_K_M", f"{GGUF_REPO}:Q8_0", "test-org/tiny", blzq}
    assert names[blzq][1:4] == ["quantized", "2.9", "KiB"]
    assert names["test-org/tiny"][1] == "safetensors"

    assert main(["rm", f"{GGUF_REPO}:q8_0"]) == 0  # only that quant
    assert "removed" in capsys.readouterr().out
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the cache alone: Q8_0 gone, Q4_K_M there
    with pytest.raises(CheckpointError, match="cached quants: Q4_K_M"):
        resolve_model_path(f"{GGUF_REPO}:Q8_0")
    assert resolve_model_path(GGUF_REPO).name == "tiny-Q4_K_M.gguf"
    blobs = list((Path(constants.HF_HUB_CACHE) / "models--test-org--tiny-GGUF" / "blobs").iterdir())
    assert len(blobs) == 1  # the Q8_0 blob went with its link

    assert main(["rm", f"{GGUF_REPO}:F16"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"error: {GGUF_REPO}:F16 is not cached; cached quants of {GGUF_REPO}: Q4_K_M"
    )
    assert main(["rm", "test-org/tiny", GGUF_REPO]) == 0
    assert not (Path(constants.HF_HUB_CACHE) / "models--test-org--tiny").exists()
    assert main(["rm", "test-org/tiny"]) == 1
    assert "error: test-org/tiny is not cached; cached models: none" in capsys.readouterr().err
    assert main(["rm", "--quantized", "nope.blzq"]) == 1
    assert main(["rm", "--quantized"]) == 0
    assert not list(quant_dir.iterdir())
    capsys.readouterr()
    assert main(["ls"]) == 0
    assert capsys.readouterr().err.strip() == "no cached models"


# ------------------------------------------------------------------------------------- end to end (CLI)


def blazr(server: HubServer, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HOME": str(home), "PYTHONWARNINGS": "ignore"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run(
        [sys.executable, "-m", "blazr", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_commands_take_org_name_quant(repos: Path, tmp_path: Path):
    server = HubServer(repos)
    try:
        home = tmp_path / "hf-home"
        r = blazr(server, home, "pull", f"{GGUF_REPO}:Q8_0")
        assert r.returncode == 0, r.stderr
        label, kind, size, where = r.stdout.rstrip("\n").split("\t")
        assert (label, kind) == (f"{GGUF_REPO}:Q8_0", "gguf") and size.startswith("1 file, ")
        assert Path(where).read_bytes() == (repos / GGUF_REPO / "tiny-Q8_0.gguf").read_bytes()
        assert Path(where).is_relative_to(home / "hub")
        r = blazr(server, home, "info", "--model", f"{GGUF_REPO}:Q8_0")
        assert r.returncode == 0, r.stderr
        assert '"format": "gguf"' in r.stdout
        prompt = ["--prompt", "abc", "--max-tokens", "6", "--temperature", "0", "--ignore-eos", "--cpu"]
        r = blazr(server, home, "generate", "--model", f"{GGUF_REPO}:q8_0", *prompt)
        assert r.returncode == 0, r.stderr
        local = home / "hub/models--test-org--tiny-GGUF/snapshots"
        (path,) = local.glob("*/tiny-Q8_0.gguf")
        expected = LLM(path, cpu=True).generate(
            "abc", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        )[0]
        assert r.stdout == expected.text + "\n" and "6 generated" in r.stderr
        assert downloaded(server) == {"tiny-Q8_0.gguf"}
        r = blazr(server, home, "info", "--model", f"{GGUF_REPO}:Q3_K_S")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert (
            r.stderr.strip()
            == f"error: {GGUF_REPO} has no Q3_K_S GGUF; quants there: Q2_K, F16, Q4_K_M, Q8_0"
        )
    finally:
        server.close()


def test_a_sharded_checkpoint_in_the_cache_counts_only_when_every_shard_is_there(tmp_path, monkeypatch):
    """Cache first / offline: an index whose shards are not all cached is no checkpoint (a partial pull)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = tmp_path / "models--o--sharded/snapshots/abc123"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--o--sharded/refs").mkdir()
    (tmp_path / "models--o--sharded/refs/main").write_text("abc123")
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"weight_map": {"a": shards[0], "b": shards[1]}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    (snapshot / "config.json").write_text("{}")
    (snapshot / shards[0]).write_bytes(b"x")
    with pytest.raises(CheckpointError, match="o/sharded: not in the Hugging Face cache"):
        resolve_model_path("o/sharded")
    (snapshot / shards[1]).write_bytes(b"y")
    assert resolve_model_path("o/sharded") == snapshot


def test_a_gguf_without_a_quant_tag_is_listed_and_resolved_by_its_file_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("BLAZR_QUANT_CACHE", "off")
    blob = tmp_path / "models--o--plain/blobs/0a1b2c"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"g" * 2048)
    snapshot = tmp_path / "models--o--plain/snapshots/abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "model.gguf").symlink_to("../../blobs/0a1b2c")
    assert main(["ls"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == [
        "o/plain:model.gguf", "gguf", "2.0", "KiB", str(snapshot / "model.gguf"),
    ]  # fmt: skip
    assert resolve_model_path("o/plain") == snapshot / "model.gguf"  # offline: the cached GGUF
