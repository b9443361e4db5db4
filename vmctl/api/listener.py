"""The API's TCP listener: an aiohttp site that bounds what unauthenticated clients can hold.

``asyncio``'s own server accepts every connection it can and gives each one a full TLS handshake
time (60 s) before it has sent a byte; ~1,000 idle connections then use up the open-file limit, the
accept loop fails with EMFILE on every turn and the API is locked out. ``BoundedSite`` accepts
connections itself instead:

- at most ``max_connections`` sockets are open at once (counting those still in their TLS
  handshake), and never more than the open-file limit leaves room for (``fd_budget``, from the limit
  as it is at each accept: an operator may lower it under a running daemon with ``prlimit``);
- a TLS handshake must finish within ``handshake_timeout_s``;
- when the limit is reached, the oldest connection still in its handshake is closed to make room
  for the new one (an idle client cannot keep a real one out); with none in a handshake the new
  connection is closed at once;
- an accept that fails for want of a file descriptor (the limit was lowered below what is open) still
  refuses the client at once: a spare descriptor, kept open for this, is closed, the connection
  accepted and closed, the spare reopened. Without it the client waited in the listen backlog while
  accept() failed (one EMFILE, a 4.1 s request, issue 23). Other failures (ENOBUFS, ...) are logged
  and retried after a short pause, never in a tight loop.
- a refusal is logged at most once per ``REFUSAL_LOG_S`` (with the count since), not per connection.

Connections past their handshake belong to aiohttp (its ``keepalive_timeout`` closes idle ones;
``AppRunner.cleanup`` closes them all at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import gc
import logging
import os
import resource
import socket
import ssl
import threading
from asyncio import sslproto
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("vmctld.api")

#: file descriptors kept free for everything but client connections (store, WAL, logs, certificates)
FD_RESERVE = 64
#: pause after a failed accept() (EMFILE and the like) before the next try
ACCEPT_RETRY_S = 0.1
#: at most one log line per this many seconds about connections refused at the limit
REFUSAL_LOG_S = 10.0
_NO_FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_DEAD_LISTENER_ERRNOS = frozenset({errno.EBADF, errno.EINVAL, errno.ENOTSOCK})


def fd_budget(max_connections: int, soft_limit: int | None = None) -> int:
    """How many client connections may be open at once: ``max_connections``, but no more than the
    open-file soft limit minus ``FD_RESERVE`` (at least 16)."""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY or soft_limit < 0:
        return max_connections
    return max(16, min(max_connections, soft_limit - FD_RESERVE))


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class _Slot:
    """One accepted socket, from accept() to its close; ``release`` is idempotent."""

    __slots__ = ("_site", "conn", "owned", "released", "task")

    def __init__(self, site: BoundedSite, conn: socket.socket) -> None:
        self._site = site
        self.conn = conn
        self.task: asyncio.Task[None] | None = None
        #: asyncio made a transport for the socket: from then on only the transport may close it (closing
        #: the descriptor under a registered transport would confuse the selector once the number is reused)
        self.owned = False
        self.released = False

    def close(self) -> None:
        if not self.owned:
            self.conn.close()

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._site._open -= 1
            self._site._pending.pop(self, None)
            self._site._closed()


class _Counted(asyncio.Protocol):
    """Passes everything to aiohttp's protocol and frees the connection's slot when it closes."""

    def __init__(self, inner: asyncio.Protocol, slot: _Slot) -> None:
        self._inner = inner
        self._slot = slot

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            self._slot.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


#: once this many connections closed since the last time, freed memory is given back to the system
TRIM_AFTER_CLOSED = 256
#: ... this long after the last of them closed (a burst of closes is trimmed once)
TRIM_DELAY_S = 1.0
#: ... and at the latest this long after it (closes that never pause)
TRIM_MAX_WAIT_S = 10.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere: musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]  # type: ignore[attr-defined]
    trim.restype = ctypes.c_int  # type: ignore[attr-defined]
    return trim


_malloc_trim = _load_malloc_trim()


def release_free_memory() -> bool:
    """Free what closed connections left behind and give the pages back to the system.

    Two things kept RSS at its peak after thousands of connections closed (issue 23):

    - a connection's Python objects (asyncio's transport and TLS protocol, aiohttp's request handler)
      hold each other in reference cycles, and those that lived long enough sit in the oldest
      generation of the garbage collector, which runs a full collection only rarely: the interpreter's
      memory arenas they pin stay mapped. ``gc.collect()`` frees them (and the arenas go back);
    - their C allocations (OpenSSL's state, buffers) are small blocks spread over the heap; glibc
      returns only the top of the heap on its own. ``malloc_trim(0)`` hands back every free page.

    True when glibc returned some."""
    gc.collect()
    if _malloc_trim is None:
        return False
    return bool(_malloc_trim(0))


_READ_BUFFER_BYTES = 256 * 1024
_read_buffers = threading.local()


def _read_buffer() -> memoryview:
    """This thread's TLS read buffer (an event loop runs on one thread; two loops never share one)."""
    view: memoryview | None = getattr(_read_buffers, "view", None)
    if view is None:
        view = _read_buffers.view = memoryview(bytearray(_READ_BUFFER_BYTES))
    return view


class _TLSProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol, reading into one buffer per thread instead of one per connection.

    ``SSLProtocol`` allocates a 256 KiB ``bytearray`` for every connection and keeps it for the
    connection's life (it was most of the ~280 KB an idle TLS client cost vmctld, issue 23). The socket
    transport fills the buffer (``get_buffer`` -> ``recv_into``) and ``buffer_updated`` copies the bytes
    into the connection's TLS input at once, in the same step of the loop, so connections served by
    one loop can share it.
    """

    #: what SSLProtocol.__init__ allocates for the connection (the shared buffer is used instead)
    max_size = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ssl_buffer_view = _read_buffer()
        # the most one read of decrypted bytes may return (SSLProtocol reads with it too)
        self.max_size = _READ_BUFFER_BYTES  # type: ignore[misc]

    def get_buffer(self, n: int) -> memoryview:
        return self._ssl_buffer_view


class BoundedSite(web.BaseSite):
    """Like ``web.TCPSite`` (same host resolution: every address ``host`` resolves to), with the
    bounds of the module docstring. ``sockets`` are the listening sockets once started."""

    __slots__ = ("_accepts", "_handshake_timeout", "_host", "_last_close", "_limit", "_listeners", "_logged_refusals",
                 "_max", "_open", "_pending", "_port", "_refusal_logged_at", "_since_trim", "_spare", "_trim",
                 "_trim_armed_at", "closed_at_limit", "trims")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, ssl_context: ssl.SSLContext | None,
                 max_connections: int, handshake_timeout_s: float, backlog: int = 1024) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._handshake_timeout = handshake_timeout_s
        self._max = max_connections
        self._limit = fd_budget(max_connections)
        #: a descriptor held open to be closed when accept() finds none left (see the module docstring)
        self._spare: int | None = None
        self._refusal_logged_at = -REFUSAL_LOG_S
        self._logged_refusals = 0
        self._listeners: list[socket.socket] = []
        self._accepts: list[asyncio.Task[None]] = []
        self._open = 0
        #: connections still in their TLS handshake, oldest first (dicts keep insertion order)
        self._pending: dict[_Slot, None] = {}
        self.closed_at_limit = 0
        #: connections closed since memory was last given back (release_free_memory), and its timer
        self._since_trim = 0
        self._trim: asyncio.TimerHandle | None = None
        self._last_close = 0.0
        self._trim_armed_at = 0.0
        self.trims = 0

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        return int(self._listeners[0].getsockname()[1]) if self._listeners else self._port

    @property
    def sockets(self) -> list[socket.socket]:
        return list(self._listeners)

    @property
    def limit(self) -> int:
        """How many client connections may be open at once, from the open-file limit as it is now."""
        limit = fd_budget(self._max)
        if limit != self._limit:
            log.warning("the open-file limit is now %s: the API accepts at most %d connections at once (was %d)",
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0], limit, self._limit)
            self._limit = limit
        return limit

    @property
    def open_connections(self) -> int:
        return self._open

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self._host or None, self._port, family=socket.AF_UNSPEC,
                                           type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            for family, kind, proto, _name, addr in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self._listeners.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(self._backlog)
                sock.setblocking(False)
        except BaseException:
            for s in self._listeners:
                s.close()
            self._listeners.clear()
            self._runner._unreg_site(self)
            raise
        self._spare = _open_spare()
        self._accepts = [asyncio.create_task(self._accept_loop(s), name="vmctld-accept") for s in self._listeners]
        log.info("API accepts at most %d connections at once (TLS handshake within %g s)", self._limit,
                 self._handshake_timeout)

    async def stop(self) -> None:
        for t in self._accepts:
            t.cancel()
        for t in self._accepts:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._accepts = []
        for s in self._listeners:
            s.close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        for slot in list(self._pending):
            self._evict(slot)
        if self._trim is not None:
            self._trim.cancel()
            self._trim = None
        await super().stop()

    def _closed(self) -> None:
        self._since_trim += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: shutting down
            return
        self._last_close = loop.time()
        if self._since_trim >= TRIM_AFTER_CLOSED and self._trim is None:
            self._trim_armed_at = self._last_close
            self._trim = loop.call_later(TRIM_DELAY_S, self._trim_due)

    def _trim_due(self) -> None:
        """Trim once the closes have paused for ``TRIM_DELAY_S`` (a wave of closes is trimmed once), or
        ``TRIM_MAX_WAIT_S`` after the threshold was crossed under a steady stream of them."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        quiet_at = self._last_close + TRIM_DELAY_S
        if now < quiet_at and now - self._trim_armed_at < TRIM_MAX_WAIT_S:
            self._trim = loop.call_later(quiet_at - now, self._trim_due)
            return
        self._trim = None
        self._since_trim = 0
        self.trims += 1
        release_free_memory()

    # ------------------------------------------------------------------ accepting
    async def _accept_loop(self, lsock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _addr = await loop.sock_accept(lsock)
            except OSError as exc:
                if exc.errno in _NO_FD_ERRNOS and self._refuse_without_fd(lsock):
                    await asyncio.sleep(0)
                    continue
                if exc.errno in _RESOURCE_ERRNOS:
                    log.error("accept() failed: %s; retrying in %g s (client connections are limited to %d)",
                              exc.strerror or exc, ACCEPT_RETRY_S, self.limit)
                    await asyncio.sleep(ACCEPT_RETRY_S)
                elif exc.errno in _DEAD_LISTENER_ERRNOS:
                    log.error("accept() failed: %s: the API stops accepting connections", exc)
                    return
                continue  # ECONNABORTED and the like: the client gave up, nothing to do
            self._admit(conn)
            # sock_accept() does not suspend while the backlog is full: let the loop run (requests, and the
            # handshakes cancelled by an eviction, which close their sockets) before the next accept
            await asyncio.sleep(0)

    def _refuse_without_fd(self, lsock: socket.socket) -> bool:
        """accept() found no descriptor: refuse the waiting client with the spare one. False when
        that did not work (no spare, even the spare's number is beyond the limit), and the caller
        pauses instead."""
        if self._spare is None:
            self._spare = _open_spare()
            return False
        os.close(self._spare)
        self._spare = None
        refused = True
        try:
            conn, _addr = lsock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):  # the client gave up meanwhile
            pass
        except OSError:
            refused = False
        else:
            conn.close()
            self._refused(f"no file descriptor left (open-file limit "
                          f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]})")
        self._spare = _open_spare()
        return refused and self._spare is not None

    def _refused(self, why: str) -> None:
        self.closed_at_limit += 1
        self._logged_refusals += 1
        now = asyncio.get_running_loop().time()
        if now - self._refusal_logged_at >= REFUSAL_LOG_S:
            log.warning("%s: closed %d new connection(s) at once (at most one such line per %g s)", why,
                        self._logged_refusals, REFUSAL_LOG_S)
            self._refusal_logged_at = now
            self._logged_refusals = 0

    def _admit(self, conn: socket.socket) -> None:
        limit = self.limit
        if self._open >= limit:
            oldest = next(iter(self._pending), None)
            if oldest is None:
                conn.close()
                self._refused(f"connection limit of {limit} reached")
                return
            self._evict(oldest)
        self._open += 1
        slot = _Slot(self, conn)
        self._pending[slot] = None
        slot.task = asyncio.create_task(self._handshake(slot))

    def _evict(self, slot: _Slot) -> None:
        """Close a connection that is still in its handshake."""
        if slot.task is not None:
            slot.task.cancel()  # a transport (if any) is closed by asyncio on the way out
        slot.close()
        slot.release()

    async def _handshake(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def factory() -> asyncio.Protocol:
            slot.owned = True  # the transport is made right after, in the same step
            return _Counted(server(), slot)

        try:
            if self._ssl_context is not None:
                # asyncio's own TLS (connect_accepted_socket(ssl=...)) gives every connection a 256 KiB read
                # buffer for its whole life; _TLSProtocol reads into one buffer per thread instead
                waiter = loop.create_future()
                tls = _TLSProtocol(loop, _Counted(server(), slot), self._ssl_context, waiter, server_side=True,
                                   ssl_handshake_timeout=self._handshake_timeout)

                def raw_factory() -> asyncio.BaseProtocol:
                    slot.owned = True  # the transport is made right after, in the same step
                    return tls

                raw, _ = await loop.connect_accepted_socket(raw_factory, slot.conn)
                try:
                    await waiter  # the handshake (a failure or its timeout closes the transport)
                except BaseException:
                    raw.abort()
                    raise
            else:
                await loop.connect_accepted_socket(factory, slot.conn)
        except (asyncio.CancelledError, Exception) as exc:
            # timed out, evicted, a bad TLS hello, a reset: asyncio closed its transport (if it made one)
            slot.close()
            slot.release()
            if not isinstance(exc, asyncio.CancelledError | OSError | ssl.SSLError):
                log.debug("connection setup failed: %r", exc)
            return
        self._pending.pop(slot, None)  # now aiohttp's; _Counted releases the slot when it closes
