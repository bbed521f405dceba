"""Real-size checkpoints (issue 14's table, in `make bench`): blazr vs llama.cpp at the Llama-3.2-1B shape,
and (`--shape 8b`) one Q4_K_M GGUF at the Llama-3.1-8B shape.

    python benchmarks/realsize.py [--rounds 2] [--prompt-len 500] [--gen 64] [--threads 2] [--only Q4_0 …]
    python benchmarks/realsize.py --shape 8b [--rounds 1] [--prompt-len 64] [--gen 16] [--cache-root DIR]
    python benchmarks/realsize.py --shape qwen3-0.6b | gemma3-1b | phi4-mini [--only Q8_0 Q4_K_M]

The checkpoint is built once into benchmarks/.cache/1b (gitignored) the way a user's files are made:
random bf16 weights at the published Llama-3.2-1B shape (2048 wide, 16 layers, 32 heads / 8 KV, MLP 8192,
tied embeddings) with SmolLM2's 49k vocabulary, saved by transformers; GGUFs from that directory by
llama.cpp's own `convert_hf_to_gguf.py` (F16) and quantizer (Q8_0, Q4_0, Q4_K_M) — tests/llama_cpp_convert.py.

`--shape qwen3-0.6b | gemma3-1b` build those published shapes the same way (their SHAPES entries);
`--shape gpt-oss-scaled` is GPT-OSS-20B's pattern at 1.98B (1536 wide, 6 layers, 32 experts / 4 active,
its 201k vocabulary), its experts stored as MXFP4 as the Hub's checkpoints are, converted with the other
weights in Q8_0: one GGUF, MXFP4 kept as stored by both engines. `--shape phi4-mini` (3.8B) goes straight
from the HF directory to a Q8_0 GGUF and requantizes that to
Q4_K_M, the HF weights then deleted (build_lean: ~7.7 GB of HF files and an F16 GGUF beside them would not
fit this VM's disk next to the other caches), so its table has the two GGUF rows alone.

`--shape 8b` builds, once, into benchmarks/.cache/8b: the Llama-3.1-8B shape (4096 wide, 32 layers,
32 heads / 8 KV, MLP 14336, untied embeddings, rope_theta 500000) with the same 49k vocabulary and
tokenizer. Its random bf16 weights (std 0.02, seeded) are written one tensor at a time as sharded
safetensors (no transformers model in RAM: peak a few GB), converted by llama.cpp's converter straight to
Q8_0 (~8 GB; the HF shards are then deleted, config and tokenizer kept), and requantized by llama.cpp's
quantizer to Q4_K_M (~4.5 GB; the Q8_0 is deleted unless the disk has plenty left). Only the Q4_K_M row
is measured, with defaults for 8B on a few cores (64-token prompt, 16 tokens, 1 round); the header gives
the GGUF's size so the peak RSS can be read against it. --cache-root moves the cache (e.g. a worktree
using the main checkout's benchmarks/.cache).

Every measurement runs in a fresh process (the engine alone in it): load time (the constructor, to ready;
the module imports before it are shown apart: torch's dominate blazr's), peak RSS, prefill tok/s of one
--prompt-len prompt (time to the first token), decode tok/s of --gen greedy tokens after it (ignore_eos).
blazr runs the same GGUF as llama.cpp (`--quantize auto`: its tensors kept as stored, F16 included; the
K-quants re-laid in 16-row groups where host tuning packs them), and the HF directory with `--quantize
bf16` / `int8` beside the F16 / Q8_0 rows. `int8` twice, and the Q4_K_M GGUF: a first load (an empty
quantization cache: the checkpoint quantized or re-laid, the cache file written in the background, timed
apart and waited for before the speed is measured) and a later one (the cache file mapped;
loading/quant_cache.py). Rounds alternate the engines; the table holds medians. The last column is each
engine's decode as a read rate (benchmarks/read_rate.py: the weight bytes of llama.cpp's file a token reads ×
decode tok/s). Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]
CACHE_ROOT = ROOT / "benchmarks" / ".cache"
PRECISIONS = ("F16", "Q8_0", "Q4_0", "Q4_K_M")
# per shape: (--rounds, --prompt-len, --gen) when not given
DEFAULTS = {
    "1b": (2, 500, 64), "8b": (1, 64, 16), "qwen3-0.6b": (2, 500, 64), "gemma3-1b": (2, 500, 64),
    "phi4-mini": (1, 500, 64), "gpt-oss-scaled": (2, 500, 64),
}  # fmt: skip
# the shapes built whole by transformers (random bf16 weights, published sizes; SmolLM2's tokenizer, which the
# converter pads to the published vocabulary with [PAD] tokens): architecture, config
SHAPES = {
    "1b": ("LlamaForCausalLM", dict(
        vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        tie_word_embeddings=True, rope_theta=500000.0,
    )),
    "qwen3-0.6b": ("Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
    )),
    "gemma3-1b": ("Gemma3ForCausalLM", dict(
        vocab_size=49152, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, max_position_embeddings=32768, tie_word_embeddings=True, rms_norm_eps=1e-6,
    )),
    # Phi-4-mini (3.8B): fused qkv / gate_up, partial rope 0.75 (LongRoPE's factors change no shape: left
    # out), its 200,064-token vocabulary; SmolLM2's tokenizer under Phi-4's GPT2Tokenizer class
    "phi4-mini": ("Phi3ForCausalLM", dict(
        vocab_size=200064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131072,
        original_max_position_embeddings=4096, partial_rotary_factor=0.75, rope_theta=10000.0,
        tie_word_embeddings=True, rms_norm_eps=1e-5, pad_token_id=0,
    )),
    # GPT-OSS-20B's pattern scaled to 1.98B parameters: 32 experts, 4 active, intermediate = hidden, sinks,
    # sliding 128 / full alternating, 64 heads of 64 / 8 KV, YaRN, its 201,088-token vocabulary — 1536 wide,
    # 6 layers (20B: 2880, 24); its experts stored as MXFP4 as the published checkpoints are
    "gpt-oss-scaled": ("GptOssForCausalLM", dict(
        vocab_size=201088, hidden_size=1536, intermediate_size=1536, num_hidden_layers=6,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
        num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072, rope_theta=150000.0,
        tie_word_embeddings=False, pad_token_id=0,
    )),
}  # fmt: skip
# shapes too big to keep their HF directory and an F16 GGUF beside the quantized files: converted straight
# to Q8_0, requantized to Q4_K_M, the HF weights then deleted (build_lean; the Q8_0 / Q4_K_M rows alone)
LEAN_SHAPES = ("phi4-mini", "gpt-oss-scaled")
MXFP4_SHAPES = ("gpt-oss-scaled",)  # one GGUF: the experts MXFP4 as stored, the other weights Q8_0
# the Llama-3.1-8B shape with SmolLM2's vocabulary (the tokenizer the converter knows)
SHAPE_8B = {
    "vocab_size": 49152, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8,
}  # fmt: skip
LAYERS_PER_SHARD = 4
CHUNK = 1 << 24  # float32 elements drawn at a time (64 MiB)
KEEP_Q8_FREE_GIB = 40.0  # keep the 8B Q8_0 only if this much disk is still free after the Q4_K_M
GiB = 2**30

CHILD = r"""
import json, sys, time
engine, path, quant, plen, gen, threads = sys.argv[1:7]
plen, gen, threads = int(plen), int(gen), int(threads)
prompt = [(i * 7919) % 40000 + 100 for i in range(plen)]
t_import = time.perf_counter()
if engine == "llama.cpp":
    import llama_cpp
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(path, n_ctx=plen + gen + 16, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    load, write = time.perf_counter() - t0, 0.0
    t = time.perf_counter(); first = None; n = 0
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        n += 1
        if first is None:
            first = time.perf_counter()
        if n == gen:
            break
    end = time.perf_counter()
else:
    import torch
    torch.set_num_threads(threads)
    from blazr import LLM, SamplingParams
    t0 = time.perf_counter()
    llm = LLM(path, cpu=True, quantize=quant, max_model_len=plen + gen + 16, max_num_seqs=1,
              max_num_batched_tokens=plen, enable_prefix_caching=False)
    load = time.perf_counter() - t0
    from blazr.loading import quant_cache
    quant_cache.wait()  # a first `--quantize` load writes its cache file in the background: timed apart,
    write = time.perf_counter() - t0 - load  # and done before the speed is measured
    t = time.perf_counter(); first = None
    for out in llm.stream_ids(prompt, SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)):
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so the child would report the parent's peak.
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
prefill, decode = plen / (first - t), (gen - 1) / (end - first)
imports = t0 - t_import
print(json.dumps({"load": load, "imports": imports, "rss": rss, "prefill": prefill, "decode": decode,
                  "write": write}))
"""


def save_random_hf(shape: str, hf: Path) -> torch.nn.Module:
    """transformers' model of `shape` (SHAPES) with random bf16 weights (seeded), saved under `hf`."""
    import torch
    import transformers

    arch, sizes = SHAPES[shape]
    config_cls = getattr(
        transformers, "Gemma3TextConfig" if arch.startswith("Gemma3") else arch[:-11] + "Config"
    )
    cfg = config_cls(**sizes, initializer_range=0.02, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = getattr(transformers, arch)(cfg).to(torch.bfloat16)
    model.save_pretrained(hf)
    torch.set_default_dtype(torch.float32)
    return model


def build(precisions: list[str], cache: Path, shape: str = "1b") -> dict[str, Path]:
    """The HF directory and the GGUFs of `shape` (SHAPES), made once (minutes; cached)."""
    sys.path.insert(0, str(ROOT))
    from tests.llama_cpp_convert import convert, export_tokenizer, quantize

    hf = cache / "hf"
    if not (hf / "model.safetensors").exists():
        print(f"building the {shape} checkpoint (random bf16 weights) …", file=sys.stderr, flush=True)
        save_random_hf(shape, hf)
    files = {"hf": hf}
    f16 = cache / f"{shape}-f16.gguf"
    if not f16.exists():
        print("converting to an F16 GGUF (llama.cpp's converter) …", file=sys.stderr, flush=True)
        convert(hf, export_tokenizer(cache / "tok"), f16, "f16")
    files["F16"] = f16
    for p in precisions:
        if p == "F16":
            continue
        out = cache / f"{shape}-{p.lower()}.gguf"
        if not out.exists():
            print(f"quantizing to {p} (llama.cpp's quantizer) …", file=sys.stderr, flush=True)
            quantize(f16, out, p)
        files[p] = out
    return files


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_gib(path: Path) -> float:
    return shutil.disk_usage(path).free / GiB


def made(step: str, t0: float, out: Path) -> None:
    size = out.stat().st_size / GiB
    log(f"{step}: {time.perf_counter() - t0:.0f} s, {size:.2f} GiB, {free_gib(out.parent):.1f} GiB free")


def random_bf16(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """normal(0, 0.02) drawn in float32 chunks (seeded by `gen`, a torch.Generator) into a bf16 tensor."""
    import torch

    out = torch.empty(shape, dtype=torch.bfloat16)
    flat = out.view(-1)
    for i in range(0, flat.numel(), CHUNK):
        n = min(CHUNK, flat.numel() - i)
        flat[i : i + n].copy_(torch.empty(n, dtype=torch.float32).normal_(0.0, 0.02, generator=gen))
    return out


def hf_8b(hf: Path) -> None:
    """Sharded safetensors (`LAYERS_PER_SHARD` layers per file, HF names, the index written last so its
    presence marks a complete directory) and config.json, one tensor generated at a time."""
    import torch
    import transformers
    from safetensors.torch import save_file

    hf.mkdir(parents=True, exist_ok=True)
    cfg = transformers.LlamaConfig(
        **SHAPE_8B, max_position_embeddings=8192, tie_word_embeddings=False, rope_theta=500000.0,
        rms_norm_eps=1e-5, initializer_range=0.02, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = torch.bfloat16
    cfg.save_pretrained(hf)
    d, ff, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    groups = [range(i, min(i + LAYERS_PER_SHARD, layers)) for i in range(0, layers, LAYERS_PER_SHARD)]
    total = len(groups)
    gen = torch.Generator().manual_seed(0)
    weight_map: dict[str, str] = {}
    size = 0
    for s, group in enumerate(groups):
        name = f"model-{s + 1:05d}-of-{total:05d}.safetensors"
        shapes: dict[str, tuple[int, ...]] = {}
        if s == 0:
            shapes["model.embed_tokens.weight"] = (cfg.vocab_size, d)
        for i in group:
            a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
            shapes |= {f"{a}.q_proj.weight": (d, d), f"{a}.k_proj.weight": (kv, d)}
            shapes |= {f"{a}.v_proj.weight": (kv, d), f"{a}.o_proj.weight": (d, d)}
            shapes |= {f"{m}.gate_proj.weight": (ff, d), f"{m}.up_proj.weight": (ff, d)}
            shapes |= {f"{m}.down_proj.weight": (d, ff)}
            shapes |= {f"model.layers.{i}.{n}_layernorm.weight": (d,) for n in ("input", "post_attention")}
        if s == total - 1:
            shapes |= {"model.norm.weight": (d,), "lm_head.weight": (cfg.vocab_size, d)}
        tensors: dict[str, torch.Tensor] = {}
        for k, shape in shapes.items():  # norms are ones (as transformers initialises them)
            t = torch.ones(shape, dtype=torch.bfloat16) if len(shape) == 1 else random_bf16(shape, gen)
            tensors[k] = t
            size += t.numel() * 2
            weight_map[k] = name
        save_file(tensors, str(hf / name), metadata={"format": "pt"})
        del tensors
        log(f"  {name} ({s + 1}/{total}), {free_gib(hf):.1f} GiB free")
    index = {"metadata": {"total_size": size}, "weight_map": weight_map}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def requantize(src: Path, out: Path, ftype: str) -> None:
    """llama.cpp's quantizer with allow_requantize (tests/llama_cpp_convert.quantize leaves it off, so a
    quantized `src` such as Q8_0 would be refused)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src.name} → {ftype}) failed ({rc})")


def build_lean(cache: Path, shape: str) -> dict[str, Path]:
    """A LEAN_SHAPES checkpoint's Q8_0 and Q4_K_M GGUFs, made once (cached): transformers writes the HF
    directory (random bf16 weights), llama.cpp's converter makes the Q8_0 straight from it, its quantizer
    requantizes that to Q4_K_M, and the HF weights are deleted (config and tokenizer kept)."""
    sys.path.insert(0, str(ROOT))
    from tests.llama_cpp_convert import convert, export_tokenizer

    q8 = cache / f"{shape}-{'mxfp4' if shape in MXFP4_SHAPES else 'q8_0'}.gguf"  # MXFP4: the rest Q8_0
    q4, hf = cache / f"{shape}-q4_k_m.gguf", cache / "hf"
    if not q8.exists():
        if not (hf / "model.safetensors.index.json").exists() and not (hf / "model.safetensors").exists():
            cache.mkdir(parents=True, exist_ok=True)
            log(f"building the {shape} checkpoint (random bf16 weights): {free_gib(cache):.1f} GiB free")
            model = save_random_hf(shape, hf)
            if shape in MXFP4_SHAPES:  # the experts as the Hub's files hold them: *_blocks / *_scales
                from tests.test_hf_gpt_oss import store_mxfp4_experts

                log("storing the experts as MXFP4 …")
                store_mxfp4_experts(hf, model.float())
            del model
        tok = export_tokenizer(cache / "tok")
        config = json.loads((tok / "tokenizer_config.json").read_text())
        if SHAPES[shape][0].startswith("Phi3"):  # Phi-4's converter takes GPT-2 BPE under this class name
            config["tokenizer_class"] = "GPT2Tokenizer"
            (tok / "tokenizer_config.json").write_text(json.dumps(config))
        log("converting straight to a Q8_0 GGUF (llama.cpp's converter) …")
        t = time.perf_counter()
        part = q8.with_suffix(".part")
        convert(hf, tok, part, "q8_0")
        part.rename(q8)
        made("Q8_0", t, q8)
    if shape in MXFP4_SHAPES:
        for f in hf.glob("model*.safetensors*"):
            f.unlink()
        return {"MXFP4": q8}
    if not q4.exists():
        requantize_q4_k_m(q8, q4)
    for f in hf.glob("model*.safetensors*"):  # config and tokenizer files stay
        f.unlink()
    return {"Q8_0": q8, "Q4_K_M": q4}


def requantize_q4_k_m(q8: Path, q4: Path) -> None:
    """The Q4_K_M GGUF `q4` from the Q8_0 GGUF `q8` (llama.cpp's quantizer, allow_requantize), written
    beside as .part and renamed when whole."""
    log("requantizing Q8_0 → Q4_K_M (llama.cpp's quantizer, allow_requantize) …")
    t = time.perf_counter()
    part = q4.with_suffix(".part")
    requantize(q8, part, "Q4_K_M")
    part.rename(q4)
    made("Q4_K_M", t, q4)


def build_8b(cache: Path) -> Path:
    """The 8B Q4_K_M GGUF, made once (tens of minutes; cached): HF shards → Q8_0 (the shards deleted) →
    Q4_K_M (the Q8_0 deleted unless KEEP_Q8_FREE_GIB stay free). Each step's time goes to stderr."""
    sys.path.insert(0, str(ROOT))
    from tests.llama_cpp_convert import convert, export_tokenizer

    q4, q8, hf = cache / "8b-q4_k_m.gguf", cache / "8b-q8_0.gguf", cache / "hf"
    if q4.exists():
        return q4
    cache.mkdir(parents=True, exist_ok=True)
    log(f"8B build in {cache}: {free_gib(cache):.1f} GiB free")
    if not q8.exists():
        if not (hf / "model.safetensors.index.json").exists():
            log("writing the 8B checkpoint (random bf16 weights, sharded safetensors) …")
            t = time.perf_counter()
            hf_8b(hf)
            log(f"HF shards: {time.perf_counter() - t:.0f} s, {free_gib(cache):.1f} GiB free")
        log("converting straight to a Q8_0 GGUF (llama.cpp's converter) …")
        t = time.perf_counter()
        part = q8.with_suffix(".part")
        convert(hf, export_tokenizer(cache / "tok"), part, "q8_0")
        part.rename(q8)
        made("Q8_0", t, q8)
        for f in hf.glob("model*.safetensors*"):  # config and tokenizer files stay
            f.unlink()
        log(f"HF shards deleted: {free_gib(cache):.1f} GiB free")
    requantize_q4_k_m(q8, q4)
    if free_gib(cache) < KEEP_Q8_FREE_GIB:
        q8.unlink()
        log(f"Q8_0 deleted: {free_gib(cache):.1f} GiB free")
    return q4


def measure(
    engine: str, path: Path, quant: str, args: argparse.Namespace, quant_cache: Path
) -> dict[str, float]:
    """One fresh process of `engine` on `path`; blazr's quantization cache in `quant_cache`."""
    cmd = [sys.executable, "-c", CHILD, engine, str(path), quant, str(args.prompt_len), str(args.gen)]
    env = {**os.environ, "BLAZR_QUANT_CACHE": str(quant_cache)}
    done = subprocess.run(
        [*cmd, str(args.threads)], capture_output=True, text=True, check=False, cwd=ROOT, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"{engine} on {path.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=tuple(DEFAULTS), default="1b")
    ap.add_argument("--cache-root", type=Path, default=CACHE_ROOT, help="default: benchmarks/.cache")
    ap.add_argument("--rounds", type=int, help="default: 2 (1b), 1 (8b)")
    ap.add_argument("--prompt-len", type=int, help="default: 500 (1b), 64 (8b)")
    ap.add_argument("--gen", type=int, help="default: 64 (1b), 16 (8b)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=PRECISIONS, help="1b only (8b: Q4_K_M alone)")
    args = ap.parse_args()
    for key, default in zip(("rounds", "prompt_len", "gen"), DEFAULTS[args.shape], strict=True):
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.shape == "8b":
        if args.only not in (None, ["Q4_K_M"]):
            ap.error("--shape 8b measures the Q4_K_M GGUF alone")
        args.only = ["Q4_K_M"]
        files = {"Q4_K_M": build_8b(args.cache_root / "8b")}
    elif args.shape in MXFP4_SHAPES:
        args.only = ["MXFP4"]
        files = build_lean(args.cache_root / args.shape, args.shape)
    elif args.shape in LEAN_SHAPES:
        if not set(args.only or ["Q8_0", "Q4_K_M"]) <= {"Q8_0", "Q4_K_M"}:
            ap.error(f"--shape {args.shape} measures the Q8_0 and Q4_K_M GGUFs alone")
        args.only = args.only or ["Q8_0", "Q4_K_M"]
        files = build_lean(args.cache_root / args.shape, args.shape)
    else:
        args.only = args.only or list(PRECISIONS)
        files = build(args.only, args.cache_root / args.shape, args.shape)
    # (row label, blazr's input, blazr's quantize mode, llama.cpp's file, blazr's quantization cache:
    # "kept" = one dir for the run, filled before the rounds; "fresh" = an empty dir for each process)
    rows = [(f"{p} GGUF, both engines", files[p], "auto", files[p], "kept") for p in args.only]
    if "Q4_K_M" in args.only:  # its K-quants re-laid at a first load, mapped from the cache by later ones
        at = [r[0] for r in rows].index("Q4_K_M GGUF, both engines")
        rows.insert(at, ("Q4_K_M GGUF, first load", files["Q4_K_M"], "auto", files["Q4_K_M"], "fresh"))
    if "F16" in args.only:  # blazr from the HF directory in bf16 beside the F16 GGUF
        rows.insert(1, ("HF bf16 `--quantize bf16` vs F16", files["hf"], "bf16", files["F16"], "kept"))
    if "Q8_0" in args.only and "hf" in files:
        at = [r[0] for r in rows].index("Q8_0 GGUF, both engines") + 1
        rows[at:at] = [
            ("HF bf16 `--quantize int8` vs Q8_0, first load", files["hf"], "int8", files["Q8_0"], "fresh"),
            ("HF bf16 `--quantize int8` vs Q8_0, cached", files["hf"], "int8", files["Q8_0"], "kept"),
        ]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="blazr-quant-cache-") as tmp:
        kept = Path(tmp) / "kept"
        for label, ours, quant, _, cache in rows:  # later loads map what a first load wrote
            if cache == "kept" and quant != "none":
                print(f"{label}: filling the quantization cache …", file=sys.stderr, flush=True)
                measure("blazr", ours, quant, args, kept)
        for r in range(args.rounds):
            for label, ours, quant, theirs, cache in rows:
                order = [("blazr", ours, quant), ("llama.cpp", theirs, "auto")]
                for engine, path, q in order if r % 2 == 0 else order[::-1]:
                    print(f"round {r + 1}: {label}: {engine} …", file=sys.stderr, flush=True)
                    where = kept if cache == "kept" else Path(tempfile.mkdtemp(dir=tmp))
                    results.setdefault((label, engine), []).append(measure(engine, path, q, args, where))
                    if where != kept:
                        shutil.rmtree(where)
                    time.sleep(1)

    def med(label: str, engine: str, key: str) -> float:
        return statistics.median(x[key] for x in results[(label, engine)])

    if args.shape == "8b":
        size = files["Q4_K_M"].stat().st_size / GiB
        head = f"8B shape (Llama-3.1-8B, 49k vocabulary), GGUF {size:.2f} GiB, "
    elif args.shape == "1b":
        head = "1B shape (Llama-3.2-1B, 49k vocabulary), "
    else:
        head = f"{args.shape} shape ({SHAPES[args.shape][0]}, published sizes and vocabulary), "
    head += f"{args.prompt_len}-token prompt, {args.gen} tokens, "
    print(head + f"{args.threads} threads, medians of {args.rounds} rounds, each engine in a fresh process")
    sys.path.insert(0, str(ROOT))
    from benchmarks.host import host_line
    from benchmarks.read_rate import decode_bytes

    print(f"\nmachine: {host_line()}\n")
    columns = (
        "weights", "blazr load s (+ imports)", "llama.cpp load s", "blazr peak RSS GiB",
        "llama.cpp peak RSS GiB", "blazr prefill / decode tok/s", "llama.cpp prefill / decode", "prefill ×",
        "decode ×", "decode GB/s of weights, blazr / llama.cpp",
    )  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = ("load", "imports", "rss", "prefill", "decode", "write")
    for label, _, _, theirs, _ in rows:
        b = {k: med(label, "blazr", k) for k in keys}
        c = {k: med(label, "llama.cpp", k) for k in keys}
        gb = decode_bytes(theirs) / 1e9  # a token's weights: the file's (bf16 / int8: as F16 / Q8_0)
        print(f"| {label} | {b['load']:.2f} (+{b['imports']:.1f}) | {c['load']:.2f} | {b['rss']:.2f} | "
              f"{c['rss']:.2f} | "
              f"{b['prefill']:.1f} / {b['decode']:.2f} | {c['prefill']:.1f} / {c['decode']:.2f} | "
              f"{b['prefill'] / c['prefill']:.2f} | {b['decode'] / c['decode']:.2f} | "
              f"{gb * b['decode']:.1f} / {gb * c['decode']:.1f} |")  # fmt: skip
    writes = [(label, med(label, "blazr", "write")) for label, *_ in rows]
    for label, write in writes:
        if write > 0.01:
            print(f"\n{label}: blazr wrote its quantization cache in {write:.2f} s more, in the background "
                  "(the speed measured after it)")  # fmt: skip


if __name__ == "__main__":
    main()
