"""JSON-RPC 2.0 envelopes (https://www.jsonrpc.org/specification)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

RequestId = int | str | None


class ErrorObject(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: int
    message: str
    data: dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    jsonrpc: str = "2.0"
    id: RequestId
    error: ErrorObject


class SuccessResponse(BaseModel):
    jsonrpc: str = "2.0"
    id: RequestId
    result: dict[str, Any]


class Notification(BaseModel):
    jsonrpc: str = "2.0"
    method: str
    params: dict[str, Any] | list[Any] | None = None


def request(method: str, params: dict[str, Any] | None, id: RequestId) -> dict[str, Any]:
    """Build a request envelope as a plain dict (for the codec)."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id}
    if params is not None:
        message["params"] = params
    return message


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message
