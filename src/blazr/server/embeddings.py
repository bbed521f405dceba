"""Embeddings: POST /v1/embeddings (OpenAI's shape) and the vectors of Ollama's /api/embed and
/api/embeddings (ollama_api.py answers those).

Each input is one prefill-only engine request (`SamplingParams.pooling`, engine/pooling.py): the engine
batches it beside generation and finishes it with its prompt, pooled as the checkpoint declares (mean when
it declares nothing) and unit length. A call's inputs go to the engine in groups of at most `max_num_seqs`.

OpenAI's fields: `input` (a string, strings, token ids or lists of token ids; at most `MAX_INPUTS`),
`model`, `encoding_format` (`float`, or `base64`: little-endian float32), `user` (logged); `dimensions`
only as the model's own size (a shorter vector would need a Matryoshka-trained model), vLLM's `priority` and
`truncate_prompt_tokens` (keep the last N tokens). An input longer than the context is a 400 unless cut.
"""

from __future__ import annotations

import base64
import struct
from typing import Annotated, Any, Literal

from pydantic import Field

from blazr.engine.async_engine import EngineRequest
from blazr.engine.sampling import SamplingParams
from blazr.server import request_in
from blazr.server.errors import bad_request
from blazr.server.schemas import MAX_INT32, Label, RequestModel, ResponseModel, TokenId
from blazr.server.serving import Serving

MAX_INPUTS = 2048  # OpenAI's limit of inputs per call


class EmbeddingRequest(RequestModel):
    """POST /v1/embeddings."""

    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)
        ]
    )
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=MAX_INT32)
    user: Label | None = None
    priority: int = Field(default=0, ge=-MAX_INT32, le=MAX_INT32)  # vLLM extra
    truncate_prompt_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)  # vLLM extra


class EmbeddingData(ResponseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(ResponseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def check_dimensions(s: Serving, dimensions: int | None, param: str = "dimensions") -> None:
    size = s.details.get("embedding_length")
    if dimensions is not None and dimensions != size:
        raise bad_request(
            f"dimensions {dimensions}: this model's embeddings have {size} dimensions, and cannot be "
            "shortened",
            param,
        )


def fit(s: Serving, ids: list[int], keep_last: int | None, param: str) -> list[int]:
    """`ids` cut to `keep_last` tokens (their end); one longer than the context is a 400."""
    if keep_last is not None:
        ids = ids[-keep_last:]
    limit = s.engine.max_model_len - 1
    if len(ids) > limit:
        raise bad_request(
            f"an input has {len(ids)} tokens, more than this model's context of {limit + 1} tokens holds "
            "(truncate it)",
            param,
            "context_length_exceeded",
        )
    return ids


async def vectors(
    s: Serving, prompts: list[list[int]], request_id: str, param: str, priority: int = 0
) -> list[list[float]]:
    """The embeddings of token-id prompts, in order (see the module docstring)."""
    params = SamplingParams(max_tokens=1, pooling=s.pooling, priority=priority)
    out: dict[str, list[float]] = {}
    group = max(1, s.engine.engine.cfg.max_num_seqs)
    for g in range(0, len(prompts), group):
        requests = [
            EngineRequest(f"{request_id}-{i}", ids, params)
            for i, ids in enumerate(prompts[g : g + group], start=g)
        ]
        stream = await s.submit(requests, param)
        async for result in stream:
            if result.embedding is not None:
                out[result.request_id] = result.embedding
    return [out[f"{request_id}-{i}"] for i in range(len(prompts))]


async def create(s: Serving, req: EmbeddingRequest, rid: str) -> EmbeddingResponse:
    model = s.check_model(req.model)
    check_dimensions(s, req.dimensions)
    texts = [req.input] if isinstance(req.input, str) else req.input
    for text in texts:
        if isinstance(text, str):
            s.check_prompt_chars(len(text), "input")
    prompts = await s.off_loop(request_in.completion_prompts, req.input, s.tokenizer)
    id_lists = [fit(s, p.ids, req.truncate_prompt_tokens, "input") for p in prompts]
    found = await vectors(s, id_lists, f"embd-{rid}", "input", req.priority)
    data = [EmbeddingData(index=i, embedding=_encode(v, req.encoding_format)) for i, v in enumerate(found)]
    num_tokens = sum(len(ids) for ids in id_lists)
    return EmbeddingResponse(
        data=data, model=model, usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens)
    )


def _encode(vector: list[float], encoding: str) -> Any:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
