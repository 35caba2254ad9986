"""HTTP errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.

Every endpoint (native and OpenAI) answers errors this way, so one client-side parser works
for both. Handlers raise `RequestError`; the app's exception handler renders it.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from radixgen.runtime.request_schema import MAX_JSON_DEPTH, json_depth
from radixgen.runtime.server.openai_protocol import ErrorDetail, ErrorResponse

ModelT = TypeVar("ModelT", bound=BaseModel)

# OpenAI's `type` strings by status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    499: "client_closed_request",
    503: "service_unavailable",
}


class RequestError(Exception):
    """A request the server refuses, with the HTTP status and the argument at fault."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code  # OpenAI's string code (e.g. "model_not_found"); None: the status


def error_body(
    message: str, status_code: int, param: str | None = None, code: str | None = None
) -> dict:
    """The JSON body of an error (also sent as the last event of a failing stream)."""
    error_type = _ERROR_TYPES.get(status_code)
    if error_type is None:
        error_type = "server_error" if status_code >= 500 else HTTPStatus(status_code).phrase
    detail = ErrorDetail(
        message=message, type=error_type, param=param, code=code if code else status_code
    )
    return ErrorResponse(error=detail).model_dump()


def error_response(
    message: str, status_code: int, param: str | None = None, code: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, status_code, param, code), status_code=status_code)


async def parse_json_body(request: Request, model: type[ModelT]) -> ModelT:
    """Reads the request body as JSON into `model`.

    Raises:
        RequestError(400): the body is not JSON, or does not fit `model` (the message names
            each bad field).
    """
    raw = await request.body()
    try:
        data = json.loads(raw)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise RequestError(f"the request body is not valid JSON: {error}") from None
    except RecursionError:  # nested beyond the parser's own stack
        data, too_deep = None, True
    else:
        too_deep = json_depth(data) > MAX_JSON_DEPTH
    if too_deep:
        raise RequestError(
            f"the request body nests deeper than {MAX_JSON_DEPTH} levels (arrays and objects)"
        )
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = [
            f"{'.'.join(map(str, detail['loc'])) or 'body'}: "
            + ("unknown field" if detail["type"] == "extra_forbidden" else detail["msg"])
            for detail in error.errors()
        ]
        first_field = error.errors()[0]["loc"]
        raise RequestError(
            "invalid request: " + "; ".join(problems),
            param=str(first_field[0]) if first_field else None,
        ) from None
