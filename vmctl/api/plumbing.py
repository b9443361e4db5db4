"""HTTP plumbing of the API: JSON bodies and answers, the error answer and its middleware, query
parameters. Every error is ``{"error": {"reference", "message", "field"}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from vmctl import auth
from vmctl.api import schemas
from vmctl.daemon.core import Daemon
from vmctl.errors import RequestTooLarge, ValidationError, VmctlError

log = logging.getLogger("vmctld.api")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DAEMON: web.AppKey[Daemon] = web.AppKey("daemon", Daemon)
#: the one route answered without credentials: ``{"status": "ok", "leader": bool}`` and nothing else
HEALTHZ = "/healthz"
METRICS: web.AppKey[Any] = web.AppKey("metrics", object)
#: the agent certificate registry (``vmctl.api.security.CertRegistry``): revoked serials are refused
CERTS: web.AppKey[Any] = web.AppKey("certs", object)
#: who sent the request (set by the auth middleware; absent on /healthz)
PRINCIPAL: web.RequestKey[auth.Principal] = web.RequestKey("principal", auth.Principal)



def error_body(exc: VmctlError) -> dict[str, Any]:
    fld = exc.fields.get("field")
    return {"error": {"reference": exc.reference, "message": exc.message,
                      "field": fld if isinstance(fld, str) else None}}


def json_dumps(data: Any) -> bytes:
    """Strict JSON as UTF-8: a NaN or an infinity is an error here (ValueError, a 500 that is logged),
    never ``NaN`` on the wire; a lone surrogate in a stored string (from before requests were
    checked) leaves as U+FFFD."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


_SURROGATES = re.compile("[\ud800-\udfff]")


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json_dumps(data), status=status, content_type="application/json", charset="utf-8")


def error_response(exc: VmctlError) -> web.Response:
    return json_response(error_body(exc), exc.http_status)


# ------------------------------------------------------------------------------ middleware


class HttpError(VmctlError):
    template = "{problem}"

    def __init__(self, status: int, reference: str, problem: str) -> None:
        super().__init__(problem=problem)
        self.http_status = status  # type: ignore[misc]
        self.reference = reference  # type: ignore[misc]


@web.middleware
async def errors_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    resp = await _errors(request, handler)
    metrics = request.app.get(METRICS)
    if metrics is not None:
        parts = request.path.split("/")
        group = "/".join(parts[:3]) if len(parts) > 2 else request.path
        if group.startswith("/v1/jobs"):
            group = "/v1/jobs"
        metrics.api_request(group if group in _GROUPS else "other", resp.status)
    return resp


_GROUPS = frozenset({"/v1/jobs", "/v1/events", "/v1/operations", "/v1/nodes", "/v1/vms", "/v1/policy", "/v1/tokens",
                     "/v1/certs", "/v1/ca", "/v1/agent", "/v1/health", "/metrics", HEALTHZ})


async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except VmctlError as exc:
        if exc.http_status >= 500:
            log.error("%s %s: %s", request.method, log_path(request), exc)
        return error_response(exc)
    except web.HTTPRequestEntityTooLarge as exc:
        size = getattr(exc, "actual_size", None) or request.content_length or 0
        return error_response(RequestTooLarge(size=size, limit=getattr(exc, "max_size", request.app._client_max_size)))
    except web.HTTPNotFound:
        return error_response(HttpError(404, "not-found", f"no route {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(HttpError(405, "method-not-allowed", f"{request.method} not allowed on {request.path}"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(HttpError(exc.status, "http-error", exc.reason))
    except Exception:
        log.exception("internal error in %s %s", request.method, log_path(request))
        return error_response(HttpError(500, "internal-error", "internal error (see the daemon log)"))


def log_path(request: web.Request) -> str:
    """The path as sent (still percent-encoded: a decoded %0A would forge a log line), shortened."""
    raw = request.raw_path
    return raw if len(raw) <= 200 else f"{raw[:200]}... ({len(raw)} characters)"



async def read_json(request: web.Request) -> Any:
    """The request body as JSON: the one reader of every handler. ``Content-Type`` must be
    ``application/json`` (UTF-8) or the answer is 415; the document is bounded and checked by
    ``schemas.parse_body`` (422 naming the field)."""
    return schemas.parse_body(await read_body(request))


async def read_body(request: web.Request) -> bytes:
    """The JSON request body as bytes, not parsed yet (``read_json``; ``POST /v1/plan`` parses it in a
    worker): 415 unless ``Content-Type`` is ``application/json`` (UTF-8), 413 beyond ``api.max_body_bytes``."""
    ctype = request.content_type
    charset = (request.charset or "utf-8").lower()
    if ctype != "application/json" or charset not in ("utf-8", "utf8"):
        got = request.headers.get("Content-Type", "")
        raise HttpError(415, "unsupported-media-type",
                         f"send the body as Content-Type: application/json (UTF-8), got {got[:100]!r}")
    return await read_on_front(request, request.read)


#: the loop that owns a request's connection (``vmctl.api.front``; absent: the loop the handler runs on)
FRONT_LOOP: web.RequestKey[asyncio.AbstractEventLoop] = web.RequestKey("front_loop", asyncio.AbstractEventLoop)

_T = TypeVar("_T")


async def read_on_front(request: web.Request, read: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """``await read()`` (a read of the request's body) on the loop that owns the request's connection: the
    front loop (``vmctl.api.front``) while the handler runs on the daemon's loop."""
    front = request.get(FRONT_LOOP)
    if front is None or front is asyncio.get_running_loop():
        return await read()
    fut = asyncio.run_coroutine_threadsafe(read(), front)
    try:
        return await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        fut.cancel()
        raise


def job_id_like(v: str) -> bool:
    """Whether ``v`` can be a job id (the decimal submission number): only those are looked up in the archive."""
    return 0 < len(v) <= 20 and v.isascii() and v.isdigit()


def query_int(v: str | None, name: str, lo: int, hi: int, default: int) -> int:
    return _query_number(v, name, int, "an integer", lo, hi, f"{lo}..{hi}", default)


def query_float(v: str | None, name: str, lo: float, hi: float, default: float) -> float:
    return _query_number(v, name, float, "a number", lo, hi, f"[{lo}, {hi}]", default)


_N = TypeVar("_N", int, float)


def _query_number(v: str | None, name: str, conv: Callable[[str], _N], what: str, lo: _N, hi: _N, span: str,
                  default: _N) -> _N:
    """A number from the query string, in ``lo..hi`` (``default`` when absent); 422 naming ``name``."""
    if v is None:
        return default
    try:
        x = conv(v)
    except ValueError as exc:
        raise ValidationError(field=name, problem=f"must be {what}, got {v[:40]!r}") from exc
    if not lo <= x <= hi:
        raise ValidationError(field=name, problem=f"must be in {span}, got {x}")
    return x


def node_names(body: dict[str, Any], key: str) -> list[str] | None:
    """An optional list of node names in a request body (null or absent: None)."""
    raw = body.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > 10_000:
        raise ValidationError(field=key, problem="must be an array of at most 10000 node names (or null)")
    return [auth.check_node_name(n, f"{key}[{i}]") for i, n in enumerate(raw)]
