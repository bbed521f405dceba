"""Which Ray Serve replica of `blazr serve --ray` (server/ray_serve.py) takes a request.

Routing (`PrefixAffinityRouter`, a Ray Serve `RequestRouter`, alpha API in Ray 2.60): "consistent hashing with
bounded loads" (Mirrokni et al., 2018) over rendezvous hashing. A request whose prompt text is at least
`prefix_chars` long (default 256 ≈ 64 tokens) is keyed by its first `prefix_chars` characters — for chat, the
tool definitions and the messages in order, role-tagged — so a shared system prompt, and the next turn of a
conversation, keep the same key; a request's `prompt_cache_key` (OpenAI's field for this) is its key instead.
Either is keyed on the request's `model` too (a multi-model server, model_pool.py: one prefix of two models
is two caches, so the same prefix of another model may go elsewhere).
The replicas are ranked by `blake2b(key, replica id)`; the first one whose ongoing-request count is within
`imbalance_threshold` of the least-loaded replica's takes the request, so an overloaded prefix spills to the
same second replica each time (which then caches it too) instead of everywhere. Requests without a key (short
prompts, GET, /tokenize) get Ray's power of two choices: the less loaded of two random replicas. The hash
needs no shared state, so several ingress replicas would agree. Loads come from Ray's per-handle queue-length
cache (each replica's ongoing requests, probed by Ray).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

DEFAULT_PREFIX_CHARS = 256  # ≈ 64 tokens = 4 prefix-cache blocks of 16
ROUTED_PATHS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/api/chat",
    "/api/generate",
)


# ------------------------------------------------------------------------------------------ routing key


def routing_key(path: str, body: bytes, prefix_chars: int = DEFAULT_PREFIX_CHARS) -> str | None:
    """The first `prefix_chars` characters of the prompt a generation request will render, or None (no
    affinity) for other paths, bodies that are not a JSON object, and prompts shorter than that. A request
    naming a `prompt_cache_key` is keyed by it instead, whatever its prompt: requests that share a key
    share a replica, so its prefix cache (OpenAI's use of the key: cache-aware routing). A body naming a
    `model` has it in front of the key: affinity is per (model, prefix)."""
    if path not in ROUTED_PATHS or not body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    model = data.get("model")
    scope = f"model:{model}\n" if isinstance(model, str) and model else ""
    cache_key = data.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:  # the client's own affinity key (OpenAI's meaning)
        return scope + "prompt_cache_key:" + cache_key
    if path in ("/v1/completions", "/api/generate"):
        text = _prompt_text(data.get("prompt"))
    elif path == "/v1/responses":  # the instructions, then the input (a string, or items like messages)
        items = data.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        system = [{"role": "system", "content": data["instructions"]}] if data.get("instructions") else []
        text = _chat_text([*system, *items] if isinstance(items, list) else None, data.get("tools"))
    else:
        system = data.get("system")  # Anthropic's
        system_messages = [{"role": "system", "content": system}] if system else []
        messages = data.get("messages")
        messages = [*system_messages, *messages] if isinstance(messages, list) else None
        text = _chat_text(messages, data.get("tools"))
    if text is None or len(text) < prefix_chars:
        return None
    return scope + text[:prefix_chars]


def _prompt_text(prompt: object) -> str | None:
    """A completions prompt as text: a string as is, token ids as decimal numbers; of a batch, the first."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return " ".join(str(i) for i in prompt)
        return _prompt_text(first)
    return None


def _chat_text(messages: object, tools: object) -> str | None:
    """The tools (templates render them first, in the system part) then each message, role-tagged."""
    if not isinstance(messages, list):
        return None
    parts = [json.dumps(tools, sort_keys=True)] if tools else []
    for m in messages:
        if not isinstance(m, dict):
            return None
        content = m.get("content")
        if isinstance(content, list):  # content parts: their text, other kinds by name
            content = "".join(
                str(p.get("text", "")) if p.get("type") == "text" else f"<{p.get('type')}>"
                for p in content
                if isinstance(p, dict)
            )
        parts.append(f"<{m.get('role')}>{content or ''}")
        if m.get("tool_calls"):
            parts.append(json.dumps(m["tool_calls"], sort_keys=True))
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------- router


def affinity_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """Rendezvous hashing: `replica_ids` ordered by their score for `key`, best first. Removing a replica
    moves only the keys it held; every process computes the same order."""
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest()

    def score(rid: str) -> bytes:
        return hashlib.blake2b(rid.encode(), digest_size=8, key=digest).digest()

    return sorted(replica_ids, key=score, reverse=True)


def affinity_choices(key: str, loads: dict[str, int | None], imbalance_threshold: int) -> list[str]:
    """The replicas to try, best first: in affinity order, those whose load (ongoing requests; None:
    unknown, taken as acceptable) is at most `imbalance_threshold` above the least-loaded one's."""
    known = [n for n in loads.values() if n is not None]
    floor = min(known) if known else 0
    return [r for r in affinity_order(key, list(loads)) if (loads[r] or 0) - floor <= imbalance_threshold]


class PrefixAffinityRouter(RequestRouter):
    """Prefix affinity with bounded loads (see the module docstring); keyless requests: power of two.

    Each returned rank is tried in order; Ray sends the request to a rank's least-loaded replica whose
    queue is not full (max_ongoing_requests), and backs off and retries when none is."""

    def initialize_state(self, imbalance_threshold: int = 8, **kwargs: Any) -> None:
        self.imbalance_threshold = imbalance_threshold

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = None
        if pending_request is not None:
            # every replica is offered each round: when all are full, back off before asking again (Ray's
            # retry loop only sleeps when told to)
            pending_request.routing_context.should_backoff = True
            key = pending_request.kwargs.get("routing_key")
        if key is None:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        loads = {rid: cache.get(r.replica_id) for rid, r in by_id.items()}
        return [[by_id[rid]] for rid in affinity_choices(key, loads, self.imbalance_threshold)]
