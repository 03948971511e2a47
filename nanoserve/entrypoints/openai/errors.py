"""Errors in OpenAI's shape: what the client hears when a request goes wrong, and never more.

Why this module exists: every failure, from a malformed body to a dead engine thread, must reach
the client as ``{"error": {"message", "type", "param", "code"}}`` with the right status, and
``param`` naming the request field where there is one. That mapping is said once, here:

- ``ApiError`` is a refusal the HTTP layer raises itself (status, message, param, headers);
- ``as_api_error`` turns whatever the engine raised into one: ``Overloaded`` is a 429 with
  ``Retry-After``, ``EngineDead`` a 503, ``InvalidRequest`` a 400 whose ``param`` is the one the
  check named (rewording a message never changes it), any other ``ValueError`` a 400, and the
  rest a 500 that names only the exception's type;
- ``add_exception_handlers`` makes FastAPI's own errors (404 route, 405 method, bad body) and
  anything unhandled take the same shape, and a client that hung up (``ClientGone``) a bare 499.

>>> as_api_error(InvalidRequest("any words at all", "temperature")).param
'temperature'
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from nanoserve.async_engine import EngineDead, Overloaded
from nanoserve.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from nanoserve.validation import InvalidRequest

log = logging.getLogger("nanoserve.server")

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowed", 413: "RequestEntityTooLarge", 429: "RateLimitError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(Exception):
    """A refusal with its HTTP status; ``param`` names the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


class ClientGone(Exception):
    """The client hung up while its response was pending."""


def error_body(status: int, message: str, param: str | None = None) -> ErrorResponse:
    info = ErrorInfo(message=message, type=ERROR_TYPES.get(status, "Error"), param=param,
                     code=status)
    return ErrorResponse(error=info)


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param).model_dump(), status,
                        headers=headers)


def as_api_error(e: Exception) -> ApiError:
    """What the client hears about an exception from the engine."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, Overloaded):
        return ApiError(429, str(e), headers={"Retry-After": str(e.retry_after)})
    if isinstance(e, EngineDead):
        return ApiError(503, str(e))
    if isinstance(e, InvalidRequest):  # the check that refused it names the field
        return ApiError(400, str(e), e.param)
    if isinstance(e, ValueError):
        return ApiError(400, str(e))
    log.error("unexpected %s", type(e).__name__, exc_info=e)
    return ApiError(500, f"internal error ({type(e).__name__})")


def failure(item) -> ApiError | None:
    """The error in a stream item: an exception, or a delta that finished with "error"."""
    if isinstance(item, Exception):
        return as_api_error(item)
    if item.finish_reason == "error":
        return ApiError(500, f"the engine failed this request: {item.error}")
    return None


def add_exception_handlers(app: FastAPI) -> None:
    """Every error ``app`` can raise, in OpenAI's shape (a hung-up client gets a bare 499)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return error_response(e.status, e.message, e.param, e.headers)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, e: ClientGone):
        return Response(status_code=499)  # nobody is listening; nginx's "client closed"

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException):
        msg = f"{e.detail}: {request.method} {request.url.path}"
        return error_response(e.status_code, msg, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        return error_response(400, "invalid request")

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception):
        log.error("unhandled %s on %s", type(e).__name__, request.url.path, exc_info=e)
        return error_response(500, f"internal error ({type(e).__name__})")
