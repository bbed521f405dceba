"""A truthful /openapi.json: every request body and every status the server answers, nothing it does not.

Routes read their JSON bodies themselves (so curl's form Content-Type works and parsing runs off the
event loop), so FastAPI cannot see them: `request_body(Model)` declares one, and `install_openapi` puts
the models' schemas (limits included) into the document. `documented(...)` lists a route's statuses with
the OpenAI error shape; FastAPI's 422, which blazr never answers (it answers 400), is removed. With an
API key, the /v1 operations declare bearer authentication.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from blazr.server.schemas_server import ErrorResponse

_REF = "#/components/schemas/{model}"
_DESCRIPTIONS = {
    400: "Malformed or unsupported request (OpenAI error JSON naming the field)",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Request body larger than --max-request-bytes",
    500: "The engine failed this request (the message names the request id of the server log)",
    503: "Loading, draining for shutdown, or full: retry later",
}
_BODY_MODELS: list[type[BaseModel]] = []


def request_body(*models: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of a route whose JSON body is `model` (or one of `models`)."""
    _BODY_MODELS.extend(models)
    refs = [{"$ref": _REF.format(model=model.__name__)} for model in models]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def documented(
    model: type[BaseModel],
    *statuses: int,
    stream: bool = False,
    model_503: type[BaseModel] | None = None,
    error_model: type[BaseModel] = ErrorResponse,
    stream_type: str = "text/event-stream",
) -> dict[int | str, dict[str, Any]]:
    """`responses` of a route: 200 with `model` (and `stream_type` when it can stream), then each error
    status with `error_model` (OpenAI's error JSON unless the API has its own; `model_503` for 503)."""
    ok: dict[str, Any] = {"model": model, "description": "Success"}
    if stream:
        ok["content"] = {stream_type: {"schema": {"type": "string"}}}
        ok["description"] = "JSON, or a stream when `stream` is true"
    out: dict[int | str, dict[str, Any]] = {200: ok}
    for status in statuses:
        model_ = model_503 if status == 503 and model_503 is not None else error_model
        out[status] = {"model": model_, "description": _DESCRIPTIONS[status]}
    return out


def install_openapi(app: FastAPI, has_api_key: bool) -> None:
    """Replace `app.openapi` with the document described in the module docstring."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in _BODY_MODELS:
            schema = model.model_json_schema(ref_template=_REF, mode="validation")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for path, item in doc.get("paths", {}).items():
            for operation in item.values():
                operation.get("responses", {}).pop("422", None)
                if has_api_key and path.startswith(("/v1", "/api/")):
                    operation["security"] = [{"bearer": []}]
        if has_api_key:
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
