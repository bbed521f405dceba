"""The one config tree (ServerConfig → LoadConfig, EngineConfig → SpeculativeConfig) and what is generated
from it: every field ↔ exactly one flag of `blazr serve` / `generate` / `chat` (both directions); flags →
config → values round trip; the newly exposed flags (--block-size, --no-fused-decode, the state-snapshot
settings) reach the engine through the CLI's and the server's real load path; `LLM(...)` keyword routing
and its errors; `blazr serve --help` lists the new flags."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from blazr import config_flags
from blazr.cli import _llm, build_parser, main
from blazr.config_flags import Leaf, leaves
from blazr.engine_config import EngineConfig, SpeculativeConfig
from blazr.errors import BlazrError
from blazr.llm import LLM, llm_configs
from blazr.load_config import LoadConfig
from blazr.server.app import load_model
from blazr.server.options import ServerConfig
from tests.tiny import build

NEW_FLAGS = ("--block-size", "--state-snapshot-interval", "--num-state-snapshots", "--fused-decode",
             "--no-fused-decode", "--cuda-graphs", "--no-cuda-graphs")  # fmt: skip
# flags of generate / chat that are no config field: the run's own input and sampling settings
NOT_CONFIG = {"help", "log_level", "prompt", "system", "max_tokens", "temperature", "top_p", "top_k", "min_p",
              "repetition_penalty", "seed", "stop", "ignore_eos"}  # fmt: skip


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _actions(command: str) -> list[argparse.Action]:
    return [a for a in _subparser(command)._actions if a.dest != "help"]


def _check_one_flag_per_field(command: str, tree: list[Leaf], extra: set[str]) -> None:
    actions = _actions(command)
    by_dest: dict[str, list[argparse.Action]] = {}
    for a in actions:
        by_dest.setdefault(a.dest, []).append(a)
    for leaf in tree:  # field → exactly one flag, spelled as the leaf says
        assert len(by_dest.get(leaf.name, [])) == 1, f"{command}: field {leaf.path} has no single flag"
        assert leaf.flag in by_dest[leaf.name][0].option_strings
    names = {leaf.name for leaf in tree}
    for a in actions:  # flag → a field (or one of the command's own, listed)
        assert a.dest in names or a.dest in extra, f"{command}: flag {a.option_strings} is no field"


def test_leaf_names_and_flags_are_unique_across_the_tree():
    tree = leaves(ServerConfig)
    assert len({leaf.name for leaf in tree}) == len(tree)
    assert len({leaf.flag for leaf in tree}) == len(tree)
    keys = [k for leaf in tree for k in leaf.keys]
    assert len(set(keys)) == len(keys)
    # the tree covers the engine, loading and speculative settings
    owners = {leaf.owner for leaf in tree}
    assert {ServerConfig, LoadConfig, EngineConfig, SpeculativeConfig} <= owners


def test_serve_flags_are_exactly_the_fields():
    _check_one_flag_per_field("serve", leaves(ServerConfig), set())


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_generate_and_chat_flags_are_exactly_the_load_and_engine_fields(command):
    _check_one_flag_per_field(command, leaves(LoadConfig) + leaves(EngineConfig), NOT_CONFIG)


def test_existing_spellings_still_parse():
    args = build_parser().parse_args(
        ["serve", "-m", "x", "-tp", "2", "--cache-memory", "1.5", "--no-prefix-cache", "--max-num-seqs", "3",
         "--served-model-name", "a", "b", "--tool-call-parser", "auto", "--ray"]
    )  # fmt: skip
    cfg = ServerConfig.from_args(args)
    assert (cfg.load.model, cfg.load.tensor_parallel_size) == ("x", 2)
    assert (cfg.engine.cache_memory_gib, cfg.engine.enable_prefix_caching, cfg.engine.max_num_seqs) == (
        1.5,
        False,
        3,
    )
    assert (cfg.served_model_names, cfg.tool_call_parser, cfg.ray) == (("a", "b"), None, True)


def _other_value(leaf: Leaf) -> Any:
    """A valid value for the leaf that is not its default."""
    default = leaf.default
    if leaf.name == "method":
        return "draft"
    if leaf.name == "draft_model":
        return "/draft"
    if leaf.is_bool:
        return not default
    if leaf.choices is not None:
        return next(c for c in leaf.choices if c not in ("auto", default))
    if typing.get_origin(leaf.base) is tuple:
        return ("a", "b")
    if leaf.base is int:
        return (default or 4) + 3
    if leaf.base is float:
        return (default or 1.0) + 1.5
    return f"x-{leaf.name}"


def _argv(values: dict[str, Any], tree: list[Leaf]) -> list[str]:
    argv: list[str] = []
    for leaf in tree:
        value = values[leaf.name]
        if leaf.is_bool:
            argv.append(leaf.flag if value else "--no-" + leaf.flag[2:])
        elif isinstance(value, tuple):
            argv += [leaf.flag, *value]
        else:
            argv += [leaf.flag, str(value)]
    return argv


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        tree = getattr(tree, name)
    return tree


def test_round_trip_flags_to_config_to_values(monkeypatch):
    """Every field set to a value other than its default, by flag: the config holds exactly those values;
    the same names as keyword arguments (ServerConfig.of) build the same tree."""
    monkeypatch.delenv("BLAZR_API_KEY", raising=False)
    tree = leaves(ServerConfig)
    values = {leaf.name: _other_value(leaf) for leaf in tree}
    assert all(values[leaf.name] != leaf.default for leaf in tree)
    cfg = ServerConfig.from_args(build_parser().parse_args(["serve", *_argv(values, tree)]))
    for leaf in tree:
        assert _get(cfg, leaf.path) == values[leaf.name], leaf.path
    assert ServerConfig.of(**values) == cfg
    assert ServerConfig.from_args(build_parser().parse_args(["serve"])) == ServerConfig()


def test_env_fills_api_key_and_log_level_only_when_no_flag(monkeypatch):
    monkeypatch.setenv("BLAZR_API_KEY", "env-key")
    monkeypatch.setenv("BLAZR_LOG", "INFO")
    cfg = ServerConfig.from_args(build_parser().parse_args(["serve"]))
    assert (cfg.api_key, cfg.log_level) == ("env-key", "info")
    cfg = ServerConfig.from_args(
        build_parser().parse_args(["serve", "--api-key", "k", "--log-level", "ERROR"])
    )
    assert (cfg.api_key, cfg.log_level) == ("k", "error")


def test_speculative_subtree_needs_its_switch():
    parse = build_parser().parse_args
    assert ServerConfig.from_args(parse(["serve"])).engine.speculative is None
    spec = ServerConfig.from_args(parse(["serve", "--speculative", "ngram", "--speculative-ngram-max", "6"]))
    assert spec.engine.speculative == SpeculativeConfig(method="ngram", ngram_max=6)
    with pytest.raises(BlazrError, match=r"^--num-speculative-tokens needs --speculative$"):
        ServerConfig.from_args(parse(["serve", "--num-speculative-tokens", "8"]))
    with pytest.raises(BlazrError, match=r"^--draft-model needs --speculative draft$"):
        ServerConfig.from_args(parse(["generate", "--draft-model", "/d"]))


def test_bad_values_are_refused_at_parse_time_or_by_the_dataclass():
    parse = build_parser().parse_args
    for argv in (["--block-size", "0"], ["--num-kv-blocks", "-1"], ["--cache-memory", "0"], ["--dtype", "x"]):
        with pytest.raises(SystemExit):
            parse(["serve", *argv])
    with pytest.raises(ValueError, match="block_size 0: expected an integer ≥ 1"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="unknown kv cache dtype 'fp8'"):
        LoadConfig(kv_cache_dtype="fp8")  # type: ignore[arg-type]
    with pytest.raises(BlazrError, match="n-gram sizes 5 … 3"):
        ServerConfig.from_args(
            parse(
                [
                    "serve",
                    "--speculative",
                    "ngram",
                    "--speculative-ngram-min",
                    "5",
                    "--speculative-ngram-max",
                    "3",
                ]
            )
        )


def test_llm_keywords_route_by_name_into_the_dataclasses():
    load, engine = llm_configs(
        "/m",
        None,
        None,
        dict(max_num_seqs=4, cache_memory=2.0, enable_prefix_caching=False, cpu=True, block_size=32,
             speculative="ngram", num_speculative_tokens=3, quantize="int8"),
    )  # fmt: skip
    assert load == LoadConfig(model="/m", cpu=True, quantize="int8")
    assert engine == EngineConfig(
        max_num_seqs=4,
        cache_memory_gib=2.0,
        enable_prefix_caching=False,
        block_size=32,
        speculative=SpeculativeConfig(num_speculative_tokens=3),
    )
    # keywords override the given configs' fields; the rest of them is kept
    base = EngineConfig(max_num_seqs=8, max_waiting=9, speculative=SpeculativeConfig(ngram_max=6))
    _, engine = llm_configs(None, LoadConfig(cpu=True), base, {"max_waiting": 3, "num_speculative_tokens": 2})
    assert engine == dataclasses.replace(
        base, max_waiting=3, speculative=SpeculativeConfig(num_speculative_tokens=2, ngram_max=6)
    )
    assert llm_configs(None, None, base, {"speculative": None})[1].speculative is None
    spec = SpeculativeConfig(method="draft", draft_model="/d")
    assert llm_configs(None, None, None, {"speculative": spec})[1].speculative == spec
    # a whole subtree by name, and single fields of it by name over it
    cfg = ServerConfig.of(engine=EngineConfig(max_num_seqs=5, block_size=8), block_size=32, port=9)
    assert (cfg.engine.max_num_seqs, cfg.engine.block_size, cfg.port) == (5, 32, 9)


def test_llm_unknown_keyword_is_a_type_error_naming_it(tmp_path):
    with pytest.raises(TypeError, match=r"max_num_seq\b.*known: .*max_num_seqs"):
        LLM(tmp_path, max_num_seq=4)
    with pytest.raises(TypeError, match="cache_memory_gib and cache_memory name the same option"):
        LLM(tmp_path, cache_memory=1.0, cache_memory_gib=2.0)
    with pytest.raises(BlazrError, match="max_num_seqs 0"):
        LLM(tmp_path, max_num_seqs=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config-tree-tiny")
    build("LlamaForCausalLM", path, vocab_size=100288)
    return path


def test_new_flags_reach_the_engine_through_the_cli(tiny):
    base = ["generate", "--model", str(tiny), "--cpu", "--dtype", "float32", "--max-model-len", "128"]
    llm, _ = _llm(build_parser().parse_args(base))
    assert llm.runner.cache_plan.block_size == 16 and llm.runner.decode_plan is not None
    new = ["--block-size", "32", "--no-fused-decode", "--state-snapshot-interval", "3", "--max-num-seqs", "2",
           "--no-cuda-graphs"]  # fmt: skip
    llm, _ = _llm(build_parser().parse_args([*base, *new]))
    assert llm.runner.cache_plan.block_size == 32 and llm.runner.block_size == 32
    assert llm.runner.decode_plan is None
    assert llm.runner.engine_cfg.cuda_graphs is False  # (graphs are CUDA-only: this host checks the config)
    assert (llm.engine.cfg.state_snapshot_interval, llm.engine.cfg.max_num_seqs) == (3, 2)
    assert llm.engine.cfg.max_model_len == 128
    out = llm.generate("Hello", None)[0]  # and it runs
    assert out.outputs[0].token_ids


def test_new_flags_reach_the_engine_through_the_server_loader(tiny):
    argv = ["serve", "--model", str(tiny), "--cpu", "--dtype", "float32", "--block-size", "32",
            "--no-fused-decode", "--max-num-seqs", "3", "--served-model-name", "t"]  # fmt: skip
    loaded = load_model(ServerConfig.from_args(build_parser().parse_args(argv)))
    runner = loaded.engine.runner
    assert runner.cache_plan.block_size == 32 and runner.decode_plan is None
    assert loaded.engine.cfg.max_num_seqs == 3 and loaded.model_names == ["t"]
    # the model's context limit (at most 4096) when --max-model-len is not given
    assert loaded.engine.cfg.max_model_len == min(4096, LLM_limit(tiny))


def LLM_limit(path: Path) -> int:
    from blazr.detect import inspect_checkpoint

    return inspect_checkpoint(path).config.max_position_embeddings


def test_llm_keyword_reaches_the_engine(tiny):
    llm = LLM(tiny, cpu=True, dtype="float32", max_model_len=64, block_size=8, fused_decode=False)
    assert (llm.runner.cache_plan.block_size, llm.runner.decode_plan, llm.engine.cfg.max_model_len) == (
        8,
        None,
        64,
    )


def test_serve_help_lists_the_new_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for flag in NEW_FLAGS:
        assert flag in text, flag
    for leaf in leaves(ServerConfig):
        assert leaf.flag in text, leaf.flag


def test_serve_run_options_coerce_by_field_type():
    """`serve run key=value` strings (ray_serve.config_from_options) are read as each field's type."""
    by_key = {k: leaf for leaf in leaves(ServerConfig) for k in leaf.keys}
    text = {"block_size": "32", "fused_decode": "false", "cache_memory": "1.5", "served_model_names": "a,b",
            "max_model_len": "none", "speculative": "ngram"}  # fmt: skip
    cfg = config_flags.build(ServerConfig, {k: by_key[k].coerce(v) for k, v in text.items()})
    assert (cfg.engine.block_size, cfg.engine.fused_decode, cfg.engine.cache_memory_gib) == (32, False, 1.5)
    assert cfg.served_model_names == ("a", "b") and cfg.engine.max_model_len is None
    assert cfg.engine.speculative == SpeculativeConfig()
    with pytest.raises(ValueError, match="block_size=0"):
        by_key["block_size"].coerce("0")


def test_state_snapshot_flags_reach_the_cache_of_a_recurrent_model(tmp_path):
    """A Mamba2 model keeps recurrent-state snapshots for prefix caching: --num-state-snapshots sizes their
    pool, --state-snapshot-interval spaces them (the cache manager's interval)."""
    sizes = dict(num_heads=8, head_dim=16, state_size=16, n_groups=1, expand=1)
    build("Mamba2ForCausalLM", tmp_path, vocab_size=100288, **sizes)
    base = ["generate", "--model", str(tmp_path), "--cpu", "--dtype", "float32", "--max-model-len", "128"]
    args = [*base, "--num-state-snapshots", "5", "--state-snapshot-interval", "3", "--cache-memory", "0.05"]
    llm, _ = _llm(build_parser().parse_args(args))
    assert llm.runner.cache_plan.num_snapshots == 5 and llm.engine.cache.snapshot_interval == 3
    llm, _ = _llm(build_parser().parse_args([*base, "--cache-memory", "0.05"]))
    assert llm.runner.cache_plan.num_snapshots != 5 and llm.engine.cache.snapshot_interval == 8
    llm, _ = _llm(build_parser().parse_args([*base, "--no-prefix-cache", "--num-state-snapshots", "5"]))
    assert not llm.engine.cfg.enable_prefix_caching and llm.runner.cache_plan.num_snapshots == 0
