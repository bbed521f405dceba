"""OpenAI's Responses API — POST /v1/responses, GET / DELETE /v1/responses/{id}, POST
/v1/responses/input_tokens — as a thin translation onto the chat core: the request's input items become a
`Conversation` (responses_input.py), the model's reasoning, text and tool calls come back from its `ChatRun`
(chat_run.py) as output items, a response body or its stream of events (responses_output.py).

Here: the endpoints — the request's checks (model, `background`, `include`), its sampling parameters, the
run's start, the stored responses' GET / DELETE, and the input's token count.

In: the `Serving`, the validated request (schemas_responses.py), the raw request (its id, the client's
disconnect). Out: a JSON body, an SSE response, or an `APIError` (400, 404).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from blazr.server import request_in
from blazr.server.errors import APIError, bad_request
from blazr.server.middleware import request_id
from blazr.server.responses_input import conversation
from blazr.server.responses_output import ResponseJob
from blazr.server.schemas_responses import ResponseInputFields, ResponsesRequest
from blazr.server.serving import Serving
from blazr.server.transport import run_until_disconnect, sse_response


async def create(s: Serving, req: ResponsesRequest, raw: Request) -> Response:
    model = s.check_model(req.model)
    rid = request_id(raw.scope)
    if req.background:
        raise bad_request("background responses are not supported", "background")
    logprobs = None
    if req.include and "message.output_text.logprobs" in req.include:
        logprobs = req.top_logprobs or 0
    for name in ("message.input_image.image_url", "computer_call_output.output.image_url"):
        if req.include and name in req.include:
            raise bad_request(f"include {name!r}: blazr takes no images", "include")
    params = request_in.basic_params(
        max_tokens=req.max_output_tokens or s.engine.max_model_len,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        seed=req.seed,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        stop=req.stop,
        logprobs=logprobs,
        priority=req.priority,
        cache_salt=req.cache_salt,
    )
    conv, messages = await s.off_loop(conversation, req, s.responses)
    job_id = f"resp_{rid}"
    run = await s.start_chat(conv, params, job_id, req.max_output_tokens)
    job = ResponseJob(s, run, req, model, messages)
    if req.stream:
        return sse_response(job.events(), run.stream, rid, "responses")
    return await run_until_disconnect(raw, job.collect(), rid)


def retrieve(s: Serving, response_id: str) -> dict[str, Any]:
    stored = s.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored.response


def delete(s: Serving, response_id: str) -> dict[str, Any]:
    if not s.responses.delete(response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def _not_found(response_id: str) -> APIError:
    message = f"response {request_in.shorten(response_id)!r} not found (never stored, deleted, or evicted)"
    return APIError(404, message, param="response_id", code="not_found")


async def input_tokens(s: Serving, req: ResponseInputFields) -> dict[str, Any]:
    """The tokens the response's input would take (the prompt /v1/responses would prefill)."""
    s.check_model(req.model)
    conv, _ = await s.off_loop(conversation, req, s.responses)
    s.check_prompt_chars(conv.num_chars(), "input")
    ids = await s.off_loop(s.format.render, conv)
    return {"object": "response.input_tokens", "input_tokens": len(ids)}
