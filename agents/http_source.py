"""The agent side of the daemon's HTTP API: a ``DesiredStateSource`` and a ``Reporter`` over HTTPS
with a client certificate (mTLS, subject ``CN=node:<name>`` issued by the cluster CA).

Agents must not import the daemon, so this speaks plain HTTP (``http.client``) to the routes of
``vmctl/api/openapi.yaml``:

- ``register(cores, hostname, backend, peers, checkpoint_peers, speed, group, memory_mib, levels,
  discipline)``:
  ``POST /v1/agent/nodes/<node>/register``.
- ``HttpSource``: a background thread long-polls ``GET /v1/agent/nodes/<node>/desired?after=G&wait=W``;
  the daemon answers as soon as the generation passes G (within 100 ms of the change), the thread
  keeps the newest document and calls ``on_change`` (the reconciler's ``wake``). ``fetch()`` returns
  the newest document at once (or, with no thread running, asks once without waiting).
- ``HttpReporter.report(observed)``: ``POST /v1/agent/nodes/<node>/observed``.

Failures to reach the daemon raise ``DaemonUnavailable`` (retryable: the reconciler backs off and
keeps the last desired state); an error answer raises ``ApiError`` with the daemon's reference.

    src = HttpSource(AgentEndpoint("https://vmctld:8443", "n1", cert, key, ca))
    src.register(cores=32, hostname="n1", backend="libvirt")
    src.start(on_change=reconciler.wake)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from vmctl.errors import ApiError, DaemonUnavailable, ValidationError
from vmctl.nodedoc import NodeDesired, NodeObserved
from vmctl.wire import desired_from_json, observed_to_json

log = logging.getLogger("vmctl.agent.http")


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    url: str  # https://host:port
    node: str
    cert_file: str
    key_file: str
    ca_file: str
    timeout_s: float = 10.0

    def ssl_context(self) -> ssl.SSLContext:
        """The agent's TLS context; a CA, certificate or key file that cannot be used is a
        ``ValidationError`` naming the config key and the file."""
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ValidationError(field="daemon.ca_file",
                                  problem=f"{self.ca_file}: no usable CA certificate ({_why(exc)})") from exc
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ValueError) as exc:
            raise ValidationError(field="daemon.cert_file/daemon.key_file",
                                  problem=f"{self.cert_file} with {self.key_file}: not a usable certificate and "
                                          f"key ({_why(exc)})") from exc
        return ctx

    def stamp(self) -> tuple[tuple[int, int, int], ...]:
        """Identity and change time of the certificate, key and CA files: a renewal replaces them (an
        atomic rename) and every connection of the agent then reconnects with the new ones."""
        out = []
        for path in (self.cert_file, self.key_file, self.ca_file):
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0, 0))
        return tuple(out)


def _why(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc)


class _Conn:
    """One keep-alive HTTPS connection; reconnects after any failure."""

    def __init__(self, ep: AgentEndpoint) -> None:
        self.ep = ep
        u = urlsplit(ep.url)
        if u.scheme != "https" or not u.hostname:
            raise ValidationError(field="daemon.url", problem=f"must be https://HOST:PORT, got {ep.url!r}")
        self.host = u.hostname
        self.port = u.port or 443
        self._stamp = ep.stamp()
        self._ctx = ep.ssl_context()
        self._conn: http.client.HTTPSConnection | None = None
        # ``shutdown`` comes from another thread while a long-poll waits: the connection is only read,
        # replaced and dropped under this lock, and a request works on its own reference to it
        self._lock = threading.Lock()
        self._shut = False

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self._reload_if_renewed()
        for attempt in (1, 2):
            with self._lock:
                if self._shut:
                    raise DaemonUnavailable(url=self.ep.url, problem="the connection was shut down")
                conn = self._conn
                if conn is None:
                    conn = self._conn = http.client.HTTPSConnection(self.host, self.port, context=self._ctx,
                                                                    timeout=timeout or self.ep.timeout_s)
                else:
                    conn.timeout = timeout or self.ep.timeout_s
                    if conn.sock is not None:
                        conn.sock.settimeout(conn.timeout)
            resp: http.client.HTTPResponse | None = None
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                if resp is not None:  # a read cut short (vmctld killed mid-answer): the response holds the
                    resp.close()  # socket when it was to close the connection; close it now, not in the GC
                self._drop(conn)
                if attempt == 2 or not isinstance(exc, http.client.RemoteDisconnected | BrokenPipeError |
                                                  ConnectionResetError):
                    raise DaemonUnavailable(url=self.ep.url, problem=str(exc) or type(exc).__name__) from exc
                continue
            if resp.status == 204 or resp.status == 304 or not raw:
                return resp.status, None
            try:
                doc = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DaemonUnavailable(url=self.ep.url, problem=f"answer is not JSON ({resp.status})") from exc
            if resp.status >= 400:
                err = doc.get("error", {}) if isinstance(doc, dict) else {}
                raise ApiError(status=resp.status, reference_text=err.get("reference", "?"),
                               problem=err.get("message", ""))
            return resp.status, doc
        raise DaemonUnavailable(url=self.ep.url, problem="no answer")  # pragma: no cover

    def _reload_if_renewed(self) -> None:
        """The certificate, key or CA file changed (a renewal): the next request connects with them. A
        set that cannot be used (a half-written renewal) keeps the current one, and is tried again."""
        stamp = self.ep.stamp()
        if stamp == self._stamp:
            return
        try:
            ctx = self.ep.ssl_context()
        except ValidationError as exc:
            log.warning("the agent's certificate files changed but cannot be used yet: %s", exc)
            return
        with self._lock:
            self._ctx, self._stamp = ctx, stamp
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        log.info("reconnecting to vmctld with the renewed certificate files")

    def _drop(self, conn: http.client.HTTPSConnection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def close(self) -> None:
        """Close the current connection; the next request opens a new one."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def shutdown(self) -> None:
        """Close for good, from any thread: a request waiting on the connection fails now, and so
        does every later one (no new connection is opened behind the caller's back)."""
        with self._lock:
            self._shut = True
            conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread (close does not)
        self.close()


class HttpSource:
    def __init__(self, endpoint: AgentEndpoint, wait_s: float = 30.0, max_backoff_s: float = 1.0) -> None:
        self.ep = endpoint
        self.wait_s = wait_s
        # short: while the daemon restarts, the agent must learn of new desired state soon after it is back
        self.max_backoff_s = max_backoff_s
        self._conn = _Conn(endpoint)
        self._lock = threading.Lock()
        self._desired: NodeDesired | None = None
        self._error: Exception | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._on_change: Any = None
        self._poll_conn: _Conn | None = None
        self.fetches = 0

    @property
    def base(self) -> str:
        return f"/v1/agent/nodes/{self.ep.node}"

    def register(self, cores: int, hostname: str = "", backend: str = "", peers: Iterable[str] | None = None,
                 checkpoint_peers: Iterable[str] | None = None, speed: float | None = None,
                 group: str | None = None, memory_mib: int | None = None, levels: int | None = None,
                 discipline: str | None = None) -> dict[str, Any]:
        """Register this node: its cores and the nodes it can migrate to -- ``peers`` (live; None: do
        not say, the daemon does not restrict) and ``checkpoint_peers`` (checkpoint files over sftp;
        None: shared storage, any node). vmctld plans no migration this node could not carry out.
        ``speed``, ``group`` and ``memory_mib`` describe the host (None: do not say, vmctld keeps its
        defaults: speed 1.0, group "default", memory unknown). ``levels`` and ``discipline`` are the
        host's VM level layout (None: do not say; vmctld assumes 2 priority levels)."""
        body: dict[str, Any] = {"cores": cores, "hostname": hostname, "backend": backend}
        for key, value in (("speed", speed), ("group", group), ("memory_mib", memory_mib), ("levels", levels),
                           ("discipline", discipline)):
            if value is not None:
                body[key] = value
        if peers is not None:
            body["peers"] = sorted(peers)
        if checkpoint_peers is not None:
            body["checkpoint_peers"] = sorted(checkpoint_peers)
        with self._lock:
            _s, doc = self._conn.request("POST", f"{self.base}/register", body)
        return dict(doc["node"]) if isinstance(doc, dict) else {}

    def _poll(self, wait: float, conn: _Conn) -> NodeDesired | None:
        after = self._desired.generation if self._desired is not None else -1
        status, doc = conn.request("GET", f"{self.base}/desired?after={after}&wait={wait:g}", timeout=wait + 10)
        self.fetches += 1
        if status == 304 or doc is None:
            return None
        return desired_from_json(doc)

    def fetch(self) -> NodeDesired | None:
        if self._thread is not None and self._thread.is_alive():
            with self._lock:
                if self._error is not None and self._desired is None:
                    err, self._error = self._error, None
                    raise err
                return self._desired
        with self._lock:
            new = self._poll(0.0, self._conn)
            if new is not None:
                self._desired = new
            return self._desired

    def start(self, on_change: Any = None) -> None:
        """Long-poll in a background thread; ``on_change()`` after every new generation."""
        self._on_change = on_change
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"desired-{self.ep.node}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._poll_conn is not None:
            self._poll_conn.shutdown()  # interrupts a waiting long-poll, and no retry reconnects
        if self._thread is not None:
            self._thread.join(timeout=self.wait_s + 15)
        self._conn.close()

    def _run(self) -> None:
        conn = _Conn(self.ep)  # the long-poll has its own connection
        self._poll_conn = conn
        delay = 0.2
        while not self._stop.is_set():
            try:
                new = self._poll(self.wait_s, conn)
                delay = 0.2
            except Exception as exc:  # daemon down or restarting: back off, keep the last state
                with self._lock:
                    self._error = exc
                log.debug("desired long-poll: %s", exc)
                self._stop.wait(delay)
                delay = min(self.max_backoff_s, delay * 2)
                continue
            if new is not None:
                with self._lock:
                    self._desired = new
                    self._error = None
                if self._on_change is not None:
                    self._on_change()
        conn.close()


class HttpReporter:
    def __init__(self, endpoint: AgentEndpoint, liveness: Liveness | None = None) -> None:
        self.ep = endpoint
        self._conn = _Conn(endpoint)
        self._lock = threading.Lock()
        self.reports = 0
        self.last_ok: float | None = None
        self.liveness = liveness  # an accepted report is contact with vmctld, as a heartbeat is

    def report(self, observed: NodeObserved) -> None:
        with self._lock:
            sent = self.liveness.now() if self.liveness is not None else 0.0
            self._conn.request("POST", f"/v1/agent/nodes/{self.ep.node}/observed", observed_to_json(observed))
        self.reports += 1
        self.last_ok = time.monotonic()
        if self.liveness is not None:
            self.liveness.contact(sent)

    def close(self) -> None:
        self._conn.close()


class Liveness:
    """What this agent knows of its contact with vmctld: the basis of self-fencing.

    ``last_contact`` is the (monotonic) time at which the last request that the leader *accepted* was
    sent -- a heartbeat or a report, both of which make vmctld note the node as seen when it receives
    them, so vmctld's "last seen" is never earlier than this agent's ``last_contact``. Once no request
    was accepted for ``fence_s`` (told by vmctld in every heartbeat answer), ``fenced`` turns true and
    the agent pauses its job VMs; vmctld requeues a silent node's jobs only ``node_down_s`` after it last
    saw it, and ``node_down_s >= fence_s + 2 x heartbeat_s`` (checked by its config), so the old run is
    paused before a new one can start. The fence lifts on a heartbeat answered after the fence began,
    and only once the reconciler works on a desired generation at least as new as that answer's (the
    daemon may have requeued the jobs meanwhile: then the new generation no longer lists them and the
    paused VMs are removed instead of resumed). See docs/daemon.md, "What vmctld promises"."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.last_contact: float | None = None
        self.heartbeat_s: float | None = None
        self.fence_s: float | None = None
        self.generation = 0  # the node's desired generation in the last heartbeat answer
        self._answer_sent = -math.inf  # when the request of that answer was sent
        self.fenced_since: float | None = None
        self.changed = threading.Event()  # set on every accepted request (wakes the fence watch)

    def now(self) -> float:
        return float(self._clock())

    def contact(self, sent_at: float, answer: Any = None) -> None:
        """A request sent at ``sent_at`` was accepted; ``answer``: a heartbeat answer."""
        with self._lock:
            if self.last_contact is None or sent_at > self.last_contact:
                self.last_contact = sent_at
            if isinstance(answer, dict):
                hb, fence, gen = answer.get("heartbeat_s"), answer.get("fence_s"), answer.get("generation")
                if isinstance(hb, int | float) and _positive(hb):
                    self.heartbeat_s = float(hb)
                if isinstance(fence, int | float) and _positive(fence):
                    self.fence_s = float(fence)
                if isinstance(gen, int) and not isinstance(gen, bool) and sent_at >= self._answer_sent:
                    self.generation = gen
                    self._answer_sent = sent_at
        self.changed.set()

    def deadline(self) -> float | None:
        """When this agent fences itself unless a request is accepted before (None: not told yet)."""
        with self._lock:
            if self.fence_s is None or self.last_contact is None:
                return None
            return self.last_contact + self.fence_s

    def begin_fence(self) -> None:
        """The fence deadline passed (the watch thread, before it pauses the VMs): from now on only a
        heartbeat answered after this moment can lift the fence, whoever looks first."""
        with self._lock:
            if self.fenced_since is None:
                self.fenced_since = self.now()
                log.warning("no contact with vmctld for %.1f s (fence_s %.1f): pausing the job VMs",
                            self.fenced_since - (self.last_contact or self.fenced_since), self.fence_s or 0.0)

    def fenced_for(self) -> float | None:
        """How long (s) the job VMs have been held paused by the fence, while they are (None: not
        fenced). A heartbeat tells vmctld, so that its fg jobs' estimates do not count the pause."""
        with self._lock:
            return None if self.fenced_since is None else max(0.0, self.now() - self.fenced_since)

    def fenced(self, held_generation: int | None) -> bool:
        """Must the job VMs be paused now? ``held_generation``: the desired generation the reconciler
        works on (None: no desired state yet)."""
        deadline = self.deadline()
        now = self.now()
        if deadline is None:
            return False
        if now > deadline:
            self.begin_fence()
            return True
        with self._lock:
            if self.fenced_since is None:
                return False
            if self._answer_sent >= self.fenced_since and (held_generation is None
                                                           or held_generation >= self.generation):
                log.warning("contact with vmctld is back (generation %d): lifting the fence", self.generation)
                self.fenced_since = None
                return False
            return True


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


class Heartbeat:
    """``POST /v1/agent/nodes/<node>/heartbeat`` every ``heartbeat_s`` (as vmctld answers; ``interval_s``
    until the first answer) on its own connection, separate from the full relist and report, so a slow
    reconcile cycle or a long resync period never makes a healthy node look lost. A second thread
    watches the fence deadline (``Liveness``) and calls ``on_fence`` the moment it passes, whatever
    the heartbeat request or the reconciler are doing; ``on_contact`` after contact returns."""

    def __init__(self, endpoint: AgentEndpoint, liveness: Liveness, interval_s: float = 1.0,
                 on_fence: Any = None, on_contact: Any = None, on_answer: Any = None) -> None:
        self.ep = endpoint
        self.liveness = liveness
        self.interval_s = interval_s
        self.on_fence = on_fence
        self.on_contact = on_contact
        self.on_answer = on_answer  # called with every accepted answer (credentials.CertRenewer.handle)
        self._conn = _Conn(endpoint)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.beats = 0
        self.failures = 0
        self._tell_fence = True  # False once a vmctld refused fenced_s (older than it)

    @property
    def interval(self) -> float:
        return self.liveness.heartbeat_s or self.interval_s

    def beat(self) -> bool:
        """One heartbeat; True when vmctld accepted it."""
        sent = self.liveness.now()
        fenced = self.liveness.fenced_for()
        body: dict[str, Any] = {} if fenced is None or not self._tell_fence else {"fenced_s": round(fenced, 3)}
        try:
            _s, doc = self._conn.request("POST", f"/v1/agent/nodes/{self.ep.node}/heartbeat", body,
                                         timeout=min(self.ep.timeout_s, max(1.0, 2 * self.interval)))
        except ApiError as exc:
            if body and exc.fields.get("status") == 422:  # a vmctld older than fenced_s: beat without it
                self._tell_fence = False
                return self.beat()
            self.failures += 1
            log.debug("heartbeat: %s", exc)
            return False
        except DaemonUnavailable as exc:
            self.failures += 1
            log.debug("heartbeat: %s", exc)
            return False
        self.beats += 1
        self.liveness.contact(sent, doc)
        if self.on_answer is not None:
            self.on_answer(doc)
        return True

    def start(self) -> None:
        self._stop.clear()
        for target, name in ((self._run, "heartbeat"), (self._watch, "fence-watch")):
            t = threading.Thread(target=target, name=f"{name}-{self.ep.node}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.liveness.changed.set()
        self._conn.shutdown()
        for t in self._threads:
            t.join(timeout=self.ep.timeout_s + 5)
        self._threads = []

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.beat()
            self._stop.wait(max(0.0, t0 + self.interval - time.monotonic()))

    def _watch(self) -> None:
        fenced = False
        while not self._stop.is_set():
            self.liveness.changed.clear()
            deadline = self.liveness.deadline()
            now = self.liveness.now()
            if deadline is not None and now > deadline:
                if not fenced:
                    fenced = True
                    self.liveness.begin_fence()
                    if self.on_fence is not None:
                        self.on_fence()
                wait = self.interval
            else:
                if fenced:
                    fenced = False
                    if self.on_contact is not None:
                        self.on_contact()
                wait = self.interval if deadline is None else deadline - now + 0.001
            self.liveness.changed.wait(max(0.001, wait))
