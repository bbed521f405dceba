"""The offline Python API: `LLM(model).generate(prompts, SamplingParams)` and `LLM.chat(...)`.

Loads a checkpoint (detect → tokenizer → weights), builds the engine and drives it until every request is
done. Prompts may be strings (special tokens written in them are recognised, like HF and vLLM) or token-id
lists; several prompts run together as one continuously batched workload.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from blazr import config_flags
from blazr.config import DTYPES, EngineConfig, dtype_name
from blazr.detect import Checkpoint, inspect_checkpoint
from blazr.engine.draft_model import DraftModelSource
from blazr.engine.engine import LLMEngine
from blazr.engine.outputs import SeqOutput
from blazr.engine.pooling import Pooling, declared_pooling
from blazr.engine.runner import ModelRunner
from blazr.engine.sampling import SamplingParams
from blazr.engine.sequence import TokenLogprob
from blazr.errors import BlazrError
from blazr.load_config import LoadConfig
from blazr.loading.loader import load_model
from blazr.model.qlinear import keep_head_x_fp32
from blazr.model_ref import resolve_model_path
from blazr.tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup

log = logging.getLogger("blazr")

Prompt = str | list[int]
_GGUF_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
                    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
                    17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}  # fmt: skip


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (vLLM's name)

    @property
    def text(self) -> str:
        return self.outputs[0].text


def pick_device(force_cpu: bool = False) -> torch.device:
    if not force_cpu and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def pick_dtype(name: str, device: torch.device, ckpt: Checkpoint) -> torch.dtype:
    """`auto`: float32 on CPU (measured: bf16 matvec is slower than fp32 there), bfloat16 on CUDA unless the
    checkpoint is float16."""
    if name != "auto":
        if name not in DTYPES:
            raise BlazrError(f"unknown dtype {name!r}; expected auto, {', '.join(DTYPES)}")
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return torch.float16 if ckpt.weights_dtype == torch.float16 else torch.bfloat16


def share_cache_budget(cfg: EngineConfig, device: torch.device, world: int) -> EngineConfig:
    """Tensor parallel on one machine: each rank's pools get 1 / world of the budget one process would
    take (a given --cache-memory is per rank already)."""
    if cfg.cache_memory_gib is not None or cfg.num_kv_blocks:
        return cfg
    from dataclasses import replace

    from blazr.state.budget import cache_budget

    return replace(cfg, cache_memory_gib=cache_budget(cfg, device) / world / 2**30)


def pick_kv_dtype(name: str, model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """Element type of the attention K/V cache. `auto`: float16 on the CPU when the linear weights are
    quantized or 16-bit (as llama.cpp's default cache: half the bytes each decode step reads, and such a
    model is no fp32 reference anyway), else the model dtype (the exact reference path)."""
    if name != "auto":
        if name not in DTYPES:
            raise BlazrError(f"unknown kv cache dtype {name!r}; expected auto, {', '.join(DTYPES)}")
        return DTYPES[name]
    from blazr.model.qlinear import QuantizedLinear

    narrow = any(isinstance(m, QuantizedLinear) and m.kind != "f32" for m in model.modules())
    return torch.float16 if device.type == "cpu" and narrow else dtype


@dataclass(frozen=True)
class _Options:
    """The tree `LLM(...)` keyword arguments are routed into, by name (config_flags.build)."""

    load: LoadConfig = field(default_factory=LoadConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)


def llm_configs(
    model: str | os.PathLike[str] | None,
    load_config: LoadConfig | None,
    engine_config: EngineConfig | None,
    options: dict[str, Any],
) -> tuple[LoadConfig, EngineConfig]:
    """`LLM`'s arguments → (LoadConfig, EngineConfig): each keyword names a field of either (or its flag's
    spelling: `cache_memory`, `prefix_cache`), overriding `load_config` / `engine_config` (else the
    defaults); `speculative` may be a method name or a SpeculativeConfig. Unknown keyword → TypeError
    naming it; a refused value → BlazrError."""
    values = dict(options)
    if model is not None:
        values["model"] = str(model)
    base = _Options(load_config or LoadConfig(), engine_config or EngineConfig())
    try:
        tree = config_flags.build(_Options, values, base=base)
    except TypeError as e:
        raise TypeError(f"LLM() got {e}") from None
    except ValueError as e:
        raise BlazrError(str(e)) from None
    return tree.load, tree.engine


def resolve_head_precision(load: LoadConfig, engine: EngineConfig) -> LoadConfig:
    """`head_precision` "auto" made "fp32" or "int8" (its help says which) from the rows one head call can
    hold, max_num_seqs × (1 + speculative drafts): at up to two, fp32 x reads as fast as 8-bit x."""
    if load.head_precision != "auto":
        return load
    spec = engine.speculative
    rows = engine.max_num_seqs * (1 + (spec.num_speculative_tokens if spec is not None else 0))
    return replace(load, head_precision="fp32" if rows <= 2 else "int8")


class LLM:
    """A loaded model with its tokenizer and engine, configured by a `LoadConfig` (what to load and how)
    and an `EngineConfig` (limits, cache, fast paths, speculative decoding) — the trees `blazr serve`'s
    flags build. Keyword arguments set single fields of either by name (`LLM(path, max_num_seqs=4,
    cache_memory=2, enable_prefix_caching=False, cpu=True)`), over `load_config` / `engine_config` when
    given; each default lives in its dataclass."""

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        load_config: LoadConfig | None = None,
        engine_config: EngineConfig | None = None,
        show_progress: bool | None = None,
        **options: Any,
    ) -> None:
        """`tensor_parallel_size` N > 1: the model is split over N ranks (torch.distributed; gloo on the
        CPU): this process is rank 0 (scheduler, sampler, server) and starts ranks 1 … N-1 on this machine,
        unless torchrun launched it (distributed/worker.py). `speculative`: speculative decoding — "ngram"
        (prompt lookup, `num_speculative_tokens` drafts a step) or a SpeculativeConfig
        (engine/speculative.py). `show_progress`: a bar while the model loads (None: blazr/progress.py's
        policy — on a terminal, unless the command line asked for quiet)."""
        t0 = time.perf_counter()
        load, engine_cfg = llm_configs(model, load_config, engine_config, options)
        load = resolve_head_precision(load, engine_cfg)  # the ranks and a draft model load the same form
        self.load_config = load
        self.path = resolve_model_path(load.model)
        self.checkpoint = inspect_checkpoint(self.path, vocab_name=load.vocab)
        self.config = self.checkpoint.config
        self.device = pick_device(load.cpu)
        self.dtype = pick_dtype(load.dtype, self.device, self.checkpoint)
        if load.num_threads is not None:
            torch.set_num_threads(load.num_threads)
        self.tokenizer: Tokenizer = load_tokenizer(self.checkpoint.tokenizer)
        if load.chat_template is not None:
            from blazr.chat_template import ChatTemplate

            self.tokenizer.chat_template = ChatTemplate.from_file(Path(load.chat_template))
        self.engine_config = engine_cfg.resolved(self.config.max_position_embeddings)
        self.is_closed = False  # a tensor-parallel model after `close`: it cannot run
        self.tp = self._start_ranks(load)
        try:
            self._load(load, show_progress)
        except BaseException:
            if self.tp is not None:  # the other ranks may be mid-load or in a broadcast: never handed on
                from blazr.distributed import ranks

                ranks.release(False)
                self.tp = None
            raise
        # embeddings: the pooling the checkpoint declares, else the mean (engine/pooling.py)
        self.pooling: Pooling = declared_pooling(self.checkpoint) or Pooling("mean")
        self.load_seconds = time.perf_counter() - t0
        log.info(
            "loaded %s (%s, %s, kv cache %s) in %.1fs; cache: %s; prefix cache %s",
            self.checkpoint.name,
            self.config.architecture,
            dtype_name(self.dtype),
            dtype_name(self.kv_dtype),
            self.load_seconds,
            self.runner.cache_plan.describe(),
            "on" if self.engine_config.enable_prefix_caching else "off",
        )

    def _load(self, load: LoadConfig, show_progress: bool | None) -> None:
        """The model (this rank's shard), its runner and cache, the draft model and the engine."""
        if self.tp is not None:  # the other ranks told what to load: this LoadConfig, its model as a path
            from blazr.distributed.worker import Setup

            setup = Setup(replace(load, model=str(self.path)), str(self.device), self.dtype,
                          self.engine_config.max_model_len)  # fmt: skip
            self.tp.broadcast_object(setup)
        self.model = load_model(
            self.checkpoint,
            self.device,
            self.dtype,
            self.engine_config.max_model_len,
            show_progress,
            quantize=load.quantize,
            tp=self.tp,
        )
        keep_head_x_fp32(self.model.lm_head, load.head_precision == "fp32")  # before any plan is recorded
        self.kv_dtype = pick_kv_dtype(load.kv_cache_dtype, self.model, self.dtype, self.device)
        if self.tp is not None:
            self.engine_config = share_cache_budget(self.engine_config, self.device, self.tp.world)
        self.runner = ModelRunner(
            self.model, self.engine_config, self.device, self.dtype, self.kv_dtype, tp=self.tp
        )
        if self.tp is not None:
            self.tp.broadcast_object((self.engine_config, self.runner.cache_plan, self.kv_dtype))
            atexit.register(self.close)  # the other ranks wait for rank 0's next step until told
        self.draft = self._load_draft(load)
        source = DraftModelSource(self.draft.engine) if self.draft is not None else None
        self.engine = LLMEngine(self.runner, self.tokenizer, self.engine_config, source)

    def _load_draft(self, load: LoadConfig) -> LLM | None:
        """The draft model of `--speculative draft` (None for other methods): loaded like this one (device,
        dtypes, quantization), with the same limits and no speculation of its own, on one rank; refused when
        its vocabulary is not this model's."""
        spec = self.engine_config.speculative
        if spec is None or spec.method != "draft":
            return None
        assert spec.draft_model is not None
        cfg = replace(self.engine_config, speculative=None, cache_memory_gib=None, num_kv_blocks=0)
        own = replace(load, model=spec.draft_model, vocab=None, chat_template=None, tensor_parallel_size=1)
        draft = LLM(load_config=own, engine_config=cfg)
        probe = "The draft model's vocabulary: 12 345, naïve café — 東京 🙂 <|x|>"
        if draft.config.vocab_size > self.config.vocab_size or draft.encode(probe) != self.encode(probe):
            draft.close()
            theirs, ours = (f"{m.tokenizer.name}, {m.config.vocab_size} ids" for m in (draft, self))
            raise BlazrError(
                f"draft model {draft.name}: its vocabulary ({theirs}) is not {self.name}'s ({ours})"
            )
        return draft

    def _start_ranks(self, load: LoadConfig) -> TPGroup | None:
        """With tensor parallelism: the other ranks led — an earlier model's idle ones, else started or
        found under torchrun (distributed/ranks.py)."""
        world = load.tensor_parallel_size
        if world == 1:
            return None
        from blazr.distributed import ranks
        from blazr.distributed.shard import shard_config

        shard_config(self.config, world)  # a model that does not split says so before any rank starts
        return ranks.lead(world, self.device)

    def close(self) -> None:
        """Tell the other tensor-parallel ranks this model is done: they wait, idle, for this process's
        next model, and exit with it (distributed/ranks.py); this model cannot run after it. Nothing to do on
        one rank. Also run at exit."""
        if self.tp is None:
            return
        from blazr.distributed import ranks

        ranks.release(self.runner.stop_workers())
        self.tp = None
        self.is_closed = True

    @property
    def name(self) -> str:
        return self.checkpoint.name

    def details(self) -> dict[str, Any]:
        """What model listings (Ollama's /api/tags, /api/show) say of it: format, family, parameter count,
        stored weights' kind, file size, context length."""
        from blazr.info import count_parameters
        from blazr.model.skeleton import skeleton

        cfg = self.config
        total, _ = count_parameters(skeleton(cfg))
        size = sum(p.stat().st_size for p in self.checkpoint.weight_files if p.exists())
        kind = dtype_name(self.checkpoint.weights_dtype).upper()
        if self.checkpoint.gguf is not None:  # llama.cpp's file type (llama_ftype), by its name
            kind = _GGUF_FILE_TYPES.get(self.checkpoint.gguf.metadata.get("general.file_type", -1), kind)
        return {
            "format": "gguf" if self.checkpoint.format == "gguf" else "safetensors",
            "family": cfg.architecture,
            "parameter_count": total,
            "quantization_level": kind,
            "size": size,
            "context_length": self.engine_config.max_model_len,
            "embedding_length": cfg.hidden_size,
            "num_layers": cfg.num_layers,
        }

    def encode(self, prompt: Prompt) -> list[int]:
        return list(prompt) if not isinstance(prompt, str) else self.tokenizer.encode(prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion, batched together; outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        id_lists = [self.encode(p) for p in prompts]  # type: ignore[arg-type]
        return self._run(id_lists, params)

    def chat(
        self,
        conversations: list[dict] | Sequence[list[dict]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One or several conversations (lists of {"role", "content"}), rendered with the chat template."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        id_lists = [self.tokenizer.encode_chat(list(c)) for c in conversations]  # type: ignore[arg-type]
        return self._run(id_lists, params)

    def _run(
        self, id_lists: list[list[int]], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[RequestOutput]:
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(id_lists)
        if len(params) != len(id_lists):
            raise BlazrError(f"got {len(params)} SamplingParams for {len(id_lists)} prompts")
        ids = [uuid.uuid4().hex for _ in id_lists]
        results: dict[str, RequestOutput] = {}
        for prompt_ids, p in zip(id_lists, params, strict=True):
            self.engine.validate(prompt_ids, p)
        for rid, prompt_ids, p in zip(ids, id_lists, params, strict=True):
            self._add_request(rid, prompt_ids, p)
            outs = [CompletionOutput(i, "", [], None) for i in range(p.n)]
            results[rid] = RequestOutput(rid, prompt_ids, outs)
        for out in self._drain():
            self._accumulate(results[out.request_id], out)
        return [results[rid] for rid in ids]

    def _add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams) -> None:
        if self.is_closed:
            raise BlazrError(f"{self.name} was closed: its tensor-parallel ranks have left it; load it again")
        self.engine.add_request(rid, prompt_ids, params)

    def _drain(self) -> Iterator[SeqOutput]:
        while self.engine.has_unfinished():
            yield from self.engine.step()

    @staticmethod
    def _accumulate(res: RequestOutput, out: SeqOutput) -> None:
        c = res.outputs[out.index]
        c.text += out.text
        c.token_ids.extend(out.token_ids)
        c.logprobs.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            res.prompt_logprobs = out.prompt_logprobs
        res.num_cached_tokens = out.num_cached_tokens
        if out.finished:
            c.finish_reason = out.finish_reason

    def embed(self, prompts: Prompt | Sequence[Prompt]) -> list[list[float]]:
        """The embedding of each prompt (a string or token ids): its final hidden states pooled as the
        checkpoint declares (mean when it declares nothing), unit length; batched like generation."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = SamplingParams(max_tokens=1, pooling=self.pooling)
        id_lists = [self.encode(p) for p in prompts]  # type: ignore[arg-type]
        for prompt_ids in id_lists:
            self.engine.validate(prompt_ids, params)
        ids = [uuid.uuid4().hex for _ in id_lists]
        for rid, prompt_ids in zip(ids, id_lists, strict=True):
            self._add_request(rid, prompt_ids, params)
        vectors: dict[str, list[float]] = {}
        for out in self._drain():
            if out.finished and out.embedding is None:
                raise BlazrError(f"embedding request {out.request_id} failed ({out.finish_reason})")
            if out.embedding is not None:
                vectors[out.request_id] = out.embedding
        return [vectors[rid] for rid in ids]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Generate one prompt, yielding text as it is produced (used by `blazr generate` and `chat`)."""
        rid = uuid.uuid4().hex
        self._add_request(rid, self.encode(prompt), params or SamplingParams())
        yield from self._stream(rid)

    def stream_ids(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Iterator[SeqOutput]:
        rid = uuid.uuid4().hex
        self._add_request(rid, prompt_ids, params or SamplingParams())
        for out in self._drain():
            if out.request_id == rid:
                yield out

    def _stream(self, rid: str) -> Iterator[str]:
        for out in self._drain():
            if out.request_id == rid and out.text:
                yield out.text
