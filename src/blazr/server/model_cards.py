"""What a multi-model server (model_pool.py) says of its models: OpenAI's /v1/models cards with each model's
state (`"status": {"value": "sleeping"}`, as llama-server's router), Ollama's /api/tags (every model) and
/api/ps (the loaded ones, with when they will sleep). Asks nothing to load: a model never loaded has no
context length or details yet, and its card leaves them out."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from blazr.server import ollama_api
from blazr.server.model_pool import ModelPool, PoolEntry
from blazr.server.schemas_server import ModelCard, ModelList, ModelStatus

NEVER = "2318-06-17T00:00:00Z"  # Ollama's expires_at of a model kept loaded for ever (keep_alive -1)


def pool_models(pool: ModelPool) -> ModelList:
    return ModelList(data=[_card(pool, e) for e in pool.entries.values()])


def pool_card(pool: ModelPool, name: str) -> ModelCard:
    """One model's card; 404 for a name the pool does not serve."""
    return _card(pool, pool.entry(name))


def _card(pool: ModelPool, entry: PoolEntry) -> ModelCard:
    s = entry.serving
    status = ModelStatus(
        value=entry.state,
        error=entry.error if entry.state == "failed" else None,
        load_seconds=round(entry.load_seconds, 3) if entry.num_loads else None,
    )
    return ModelCard(
        id=entry.name,
        created=pool.created,
        root=s.root if s is not None else entry.name,
        max_model_len=s.engine.max_model_len if s is not None else None,
        status=status,
    )


def _modified(created: int) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat().replace("+00:00", "Z")


def pool_tags(pool: ModelPool) -> dict[str, Any]:
    """Ollama's /api/tags: every model (details once it has been loaded)."""
    models = []
    for entry in pool.entries.values():
        details = entry.details or {}
        models.append(
            {
                "name": entry.name,
                "model": entry.name,
                "modified_at": _modified(pool.created),
                "size": details.get("size", 0),
                "digest": ollama_api.DIGEST,
                "details": ollama_api.details_of(details),
            }
        )
    return {"models": models}


def pool_ps(pool: ModelPool) -> dict[str, Any]:
    """Ollama's /api/ps: the models loaded now, each with when it will sleep if left idle."""
    tags = {m["name"]: m for m in pool_tags(pool)["models"]}
    models = []
    for entry in pool.loaded():
        assert entry.serving is not None
        timeout = pool.timeout(entry)
        if timeout is None:
            expires = NEVER
        else:
            idle = 0.0 if entry.num_in_use else time.monotonic() - entry.last_used
            at = datetime.now(UTC) + timedelta(seconds=max(0.0, timeout - idle))
            expires = at.isoformat().replace("+00:00", "Z")
        models.append(
            {
                **tags[entry.name],
                "expires_at": expires,
                "size_vram": 0,
                "context_length": entry.serving.engine.max_model_len,
            }
        )
    return {"models": models}
