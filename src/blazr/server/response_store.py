"""Stored responses of the Responses API (`store: true`, OpenAI's default): what `previous_response_id`
continues from, and what GET / DELETE /v1/responses/{id} read and remove.

Bounded and in memory: at most `max_responses` responses and `max_chars` characters of conversation text
(the two caps of `StoredResponse.size`); past either, the least recently used go first. Nothing outlives
the process, and with `blazr serve --ray` each replica keeps its own (a `previous_response_id` must reach
the replica that stored it: send the same `prompt_cache_key`, which routes by it). Thread-safe (the event
loop and the preprocessing pool both touch it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_RESPONSES = 1024
MAX_CHARS = 64 << 20  # characters of stored text


@dataclass(frozen=True)
class StoredResponse:
    """A response and the conversation it ends: the messages before it (its input, after any earlier
    response's) and its output as assistant / tool messages, in the chat template's conventions."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    size: int  # characters, for the bound


class ResponseStore:
    """Responses by id, least recently used first out (see the module docstring)."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS) -> None:
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        size = sum(len(str(m.get(k) or "")) for m in messages for k in ("content", "reasoning_content"))
        size += sum(len(str(item)) for item in response.get("output", ()))
        item = StoredResponse(response, messages, size)
        with self._lock:
            old = self._items.pop(response["id"], None)
            if old is not None:
                self._chars -= old.size
            self._items[response["id"]] = item
            self._chars += size
            while self._items and (len(self._items) > self.max_responses or self._chars > self.max_chars):
                _, gone = self._items.popitem(last=False)
                self._chars -= gone.size

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None:
                self._items.move_to_end(response_id)
            return item

    def delete(self, response_id: str) -> bool:
        with self._lock:
            item = self._items.pop(response_id, None)
            if item is not None:
                self._chars -= item.size
            return item is not None
