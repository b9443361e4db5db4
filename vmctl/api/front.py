"""The API's front thread: the TLS listener and HTTP on an event loop of their own, so that ``GET /healthz``
answers while the daemon's event loop is busy (issue 27).

The daemon's event loop thread runs the decision loop's own steps (housekeeping, the view's reading of
the state, actuation and commit: tens to hundreds of ms at 1,000 nodes x 32 cores) and every handler
that reads or changes the ``Daemon``. A ``/healthz`` served there waited behind them: p99 204 ms at load
13 while deciding. Here the connections (accept, TLS, HTTP parsing, writing the answer) live on the
front loop, in its own thread, and every request but ``/healthz`` is handed to the daemon's loop
whole: the middlewares (errors, authentication, audit) and the handler run there, as before, so the
decision loop and the handlers still never interleave inside a change. ``/healthz`` is answered on
the front loop from what may be read from any thread (``DaemonServer.health``): whether the store was
found damaged and whether this daemon leads, read as they are now, and the policy's ``waiting``,
published by the daemon's loop after every pass.

The body of a request is still read after its authentication (``plumbing.read_body``): from the
daemon's loop, the read is run on the front loop (``plumbing.read_on_front``). A request whose client went away
is cancelled on the front loop, and with it its run on the daemon's loop (a parked long poll ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from vmctl.api.plumbing import FRONT_LOOP, HEALTHZ, Handler

log = logging.getLogger("vmctld.api")

_T = TypeVar("_T")


def make_front_mw(daemon_loop: asyncio.AbstractEventLoop,
                  chain: Callable[[web.Request, Handler], Awaitable[web.StreamResponse]],
                  healthz: Handler) -> Any:
    """The front app's one middleware: ``/healthz`` here, everything else (``chain``: the middlewares and
    the handler) on ``daemon_loop``."""

    @web.middleware
    async def front_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == HEALTHZ and request.method in ("GET", "HEAD"):
            return await healthz(request)
        request[FRONT_LOOP] = asyncio.get_running_loop()
        fut = asyncio.run_coroutine_threadsafe(_run(chain, request, handler), daemon_loop)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()  # the client went away (or the server stops): end the run on the daemon's loop too
            raise

    return front_mw


async def _run(chain: Callable[[web.Request, Handler], Awaitable[web.StreamResponse]], request: web.Request,
               handler: Handler) -> web.StreamResponse:
    return await chain(request, handler)


class FrontThread:
    """An event loop in a thread of its own (``vmctld-api``): ``start()``, ``run(coro)`` from another
    loop, ``stop()``."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None  # made by start(): an unstarted one holds nothing
        self._thread = threading.Thread(target=self._main, name="vmctld-api", daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "FrontThread.start() first"
        return self._loop

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        loop = self.loop
        # what is left (a TLS connection whose client never answered the close_notify): aborted, so that no
        # socket outlives the loop; then what asyncio.run does before closing
        for transport in list(getattr(loop, "_transports", {}).values()):
            if transport is not None and not transport.is_closing():
                transport.abort()
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.sleep(0))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    async def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the front loop and wait for it from the calling loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        """Stop the front loop and wait for its thread (blocking: call it in a worker thread)."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
