"""The served model, shared by every front-end: names, engine, tokenizer, chat format, the preprocessing
pool, and the steps every endpoint takes — check the model, check and compile a structured-output spec,
plan a conversation (chat_format.py) and submit it to the AsyncEngine (a `ChatRun`, chat_run.py), submit
plain prompts.

The front-ends are thin translations onto this: openai_completions.py and openai_chat.py (OpenAI's
/v1/completions and /v1/chat/completions), openai_responses.py (the Responses API), anthropic_messages.py
(Anthropic's /v1/messages), ollama_api.py (Ollama's /api/*) and embeddings.py.

Off the event loop: request parsing, tokenization and chat-template rendering run on a small thread pool,
so a large prompt never stalls other connections or /health; a text prompt longer than the context could
hold at the vocabulary's longest token is refused before it is tokenized at all.

Errors: a request the engine cannot take → 400 naming the field (context length: code
`context_length_exceeded`), the server is full → 503 + Retry-After, the engine stopped → 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from blazr.engine.async_engine import (
    AsyncEngine,
    EngineDeadError,
    EngineRequest,
    RequestStream,
)
from blazr.engine.failures import QueueFullError
from blazr.engine.grammar import StructuredOutput
from blazr.engine.pooling import Pooling
from blazr.engine.sampling import SamplingParams
from blazr.errors import BlazrError
from blazr.server.chat_format import ChatFormat, ChatPlan
from blazr.server.chat_run import ChatRun, prepare_stops
from blazr.server.conversation import Conversation
from blazr.server.errors import APIError, bad_request
from blazr.server.request_in import shorten
from blazr.server.response_store import ResponseStore
from blazr.server.schemas_server import ModelCard, ModelList
from blazr.tokenizer import Tokenizer

log = logging.getLogger("blazr.server")

RETRY_AFTER_S = "1"
NUM_PREPROCESS_THREADS = 2
T = TypeVar("T")


class Serving:
    """The served model (see the module docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        tokenizer: Tokenizer,
        model_names: list[str],
        root: str,
        *,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        details: dict[str, Any] | None = None,
        pooling: Pooling | None = None,
        responses: ResponseStore | None = None,
    ) -> None:
        """`tool_call_parser`: a name in TOOL_PARSERS, or None to pick one from the chat template;
        `reasoning_parser`: a name in REASONING_PARSERS, or None for no reasoning split; `details`: what
        model listings say of it (`LLM.details`); `pooling`: how embeddings pool; `responses`: the stored
        responses (a model pool shares one store across its models)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_names = model_names
        self.root = root
        self.format = ChatFormat(tokenizer, tool_call_parser, reasoning_parser)
        self.responses = responses or ResponseStore()  # the Responses API's stored responses
        self.details = details or {}
        self.pooling = pooling or Pooling("mean")  # how embeddings pool (engine/pooling.py)
        self.created = int(time.time())
        self.pool = ThreadPoolExecutor(NUM_PREPROCESS_THREADS, thread_name_prefix="blazr-preprocess")
        # No prompt of more characters fits the context, whatever its tokens (bytes ≥ characters).
        self.max_prompt_chars = engine.max_model_len * tokenizer.max_token_chars()

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` on the preprocessing pool (parsing, tokenizing, templating)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def warm_up(self) -> None:
        """Build the grammar library's view of the vocabulary (~0.2 s at 50k tokens) on the preprocessing
        pool now, not on the first structured request."""

        def warm() -> None:
            try:
                self.engine.compile_grammar(StructuredOutput(json_object=True))
            except Exception:  # the first structured request will report it
                log.debug("warming up structured output failed", exc_info=True)

        self.pool.submit(warm)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------------------------------- models

    def models(self) -> ModelList:
        return ModelList(data=[self._card(name) for name in self.model_names])

    def model(self, model_id: str) -> ModelCard:
        self.check_model(model_id)
        return self._card(model_id)

    def _card(self, name: str) -> ModelCard:
        return ModelCard(
            id=name, created=self.created, root=self.root, max_model_len=self.engine.max_model_len
        )

    def check_model(self, name: str | None) -> str:
        """The name reported in responses; 404 for a model this server does not serve."""
        if name and name not in self.model_names:
            message = f"The model `{shorten(name)}` does not exist."
            raise APIError(404, message, param="model", code="model_not_found")
        return self.model_names[0]

    # ----------------------------------------------------------------------------------- submission

    async def submit(self, requests: list[EngineRequest], param: str) -> RequestStream:
        try:
            return await self.engine.generate(requests)
        except QueueFullError as e:
            raise APIError(503, str(e), code="queue_full", headers={"Retry-After": RETRY_AFTER_S}) from None
        except EngineDeadError:
            raise APIError(500, "the engine has stopped", code="engine_error") from None
        except BlazrError as e:
            limit = self.engine.max_model_len
            over = any(len(r.prompt_ids) + r.params.max_tokens > limit for r in requests)
            raise bad_request(str(e), param, "context_length_exceeded" if over else None) from None

    async def compile_structured(self, spec: StructuredOutput, param: str) -> None:
        """Check and compile `spec` on the preprocessing pool (cached by the engine); 400 if invalid."""
        try:
            await self.off_loop(self.engine.compile_grammar, spec)
        except BlazrError as e:
            raise bad_request(str(e), param) from None

    def check_prompt_chars(self, num_chars: int, param: str) -> None:
        if num_chars > self.max_prompt_chars:
            limit = self.engine.max_model_len
            raise bad_request(
                f"the prompt has {num_chars} characters, more than this model's context of {limit} tokens "
                "can hold",
                param,
                "context_length_exceeded",
            )

    # ----------------------------------------------------------------------------------------- chat

    async def start_chat(
        self, conv: Conversation, params: SamplingParams, request_id: str, max_tokens: int | None
    ) -> ChatRun:
        """Plan a conversation (off the event loop) and submit it (see `start_plan`)."""
        self.check_prompt_chars(conv.num_chars(), conv.param("messages"))
        plan = await self.off_loop(self.format.plan, conv)
        return await self.start_plan(plan, params, request_id, max_tokens, conv.param("messages"))

    async def start_plan(
        self,
        plan: ChatPlan,
        params: SamplingParams,
        request_id: str,
        max_tokens: int | None,
        param: str = "messages",
    ) -> ChatRun:
        """Submit a planned request: the plan's grammar compiled (a bad one is a 400 naming its field), and
        with `max_tokens` None the rest of the context to generate in (as vLLM)."""
        plan.apply(params)
        if plan.structured is not None:
            await self.compile_structured(plan.structured, plan.structured_param or param)
        if max_tokens is None:
            params.max_tokens = max(1, self.engine.max_model_len - len(plan.prompt_ids))
            if params.min_tokens > params.max_tokens:
                raise bad_request(
                    f"min_tokens ({params.min_tokens}) exceeds the {params.max_tokens} tokens the context "
                    "leaves after the prompt",
                    "min_tokens",
                )
        else:
            params.max_tokens = max_tokens
        cut = prepare_stops(params)
        stream = await self.submit([EngineRequest(request_id, plan.prompt_ids, params)], param)
        return ChatRun(plan, params, request_id, stream, cut)
