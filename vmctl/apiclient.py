"""A thin, synchronous HTTP client for the vmctld API v1 (stdlib only: ``http.client`` + ``ssl``).

Used by the operator CLI (``vmctl.cli.connect``), the job-submission library (``vmctl.client``) and the
demo. It knows the URL layout of the API and nothing about the daemon's internals (it must not import
``vmctl.daemon``, ``vmctl.store`` or ``vmctl.agents``).

Error answers (``{"error": {"reference", "message", "field"}}``) are turned back into the vmctl error
class with the same ``reference`` (falling back on the HTTP status), so the CLI's exit codes follow
the server's verdict: a 404 exits 3, a 409 exits 4, a 401/403 exits 5, a 422 exits 2. A daemon that
cannot be reached is ``DaemonUnavailable`` (exit 6).

    >>> c = ApiClient("http://127.0.0.1:8080", token="t")
    >>> c.url_for("/v1/jobs", {"state": "queued", "limit": 5})
    'http://127.0.0.1:8080/v1/jobs?state=queued&limit=5'
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vmctl import errors

DEFAULT_URL = "https://127.0.0.1:8443"  # what vmctld serves by default (etc/vmctld.yaml api.port)
USER_AGENT = "vmctl-apiclient/1"


def _all_error_classes() -> dict[str, type[errors.VmctlError]]:
    out: dict[str, type[errors.VmctlError]] = {}
    stack: list[type[errors.VmctlError]] = [errors.VmctlError]
    while stack:
        cls = stack.pop()
        out.setdefault(cls.reference, cls)
        stack.extend(cls.__subclasses__())
    return out


_STATUS_CLASSES: dict[int, type[errors.VmctlError]] = {
    400: errors.UserError,
    401: errors.Unauthenticated,
    403: errors.Forbidden,
    404: errors.NotFound,
    409: errors.Conflict,
    413: errors.RequestTooLarge,
    422: errors.ValidationError,
    503: errors.DaemonUnavailable,
}


def error_from_response(status: int, body: bytes, url: str = "") -> errors.VmctlError:
    """Build the vmctl error an API error answer stands for.

    The instance carries the server's message verbatim (``str(exc)``), the server's reference (as
    ``exc.fields["reference"]``), the ``field`` path and the HTTP status. The class is looked up by
    reference first, then by status; anything else is ``ApiError``."""
    reference = ""
    message = ""
    field: str | None = None
    try:
        doc = json.loads(body.decode("utf-8")) if body else {}
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            reference = str(err.get("reference") or "")
            message = str(err.get("message") or "")
            f = err.get("field")
            field = str(f) if f is not None else None
    except (ValueError, UnicodeDecodeError):
        pass
    if not message:
        text = body.decode("utf-8", "replace").strip()
        message = text[:200] if text else http.client.responses.get(status, "error")
    cls = _all_error_classes().get(reference) if reference else None
    if cls is None or cls is errors.VmctlError:
        cls = _STATUS_CLASSES.get(status)
        if cls is None:
            cls = errors.ApiError
    if field and field not in message:
        message = f"{field}: {message}"
    return make_error(cls, message, status=status, reference=reference or cls.reference, field=field, url=url)


def make_error(cls: type[errors.VmctlError], message: str, **fields: Any) -> errors.VmctlError:
    """An instance of ``cls`` whose message is ``message`` (the class template is bypassed, since the
    server already formatted the message)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.fields = dict(fields)
    return exc


@dataclass(frozen=True)
class Response:
    status: int
    body: Any  # parsed JSON, or the raw text for non-JSON bodies (``/metrics``), None when empty


class ApiClient:
    """One daemon endpoint. Thread-safe: every request opens its own connection (the CLI makes few
    requests; the library polls slowly), so no connection state is shared between threads."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        raw = url or os.environ.get("VMCTL_URL") or DEFAULT_URL
        parsed = urllib.parse.urlsplit(raw)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise errors.UserError(where="--url", problem=f"{raw!r} is not an http:// or https:// URL")
        try:
            port = parsed.port
        except ValueError as exc:
            raise errors.UserError(where="--url", problem=f"{raw!r} has a bad port") from exc
        self.url = raw.rstrip("/")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = port or (443 if parsed.scheme == "https" else 80)
        self.base_path = parsed.path.rstrip("/")
        self.token = token if token is not None else os.environ.get("VMCTL_TOKEN")
        self.ca = ca if ca is not None else os.environ.get("VMCTL_CA")
        self.cert = cert
        self.key = key
        self.timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if self.scheme == "https":
            if self.ca and not os.path.isfile(self.ca):
                what = "is not a file" if os.path.exists(self.ca) else "does not exist"
                raise errors.UserError(where="--ca / VMCTL_CA", problem=f"the CA file {self.ca} {what}")
            try:
                ctx = ssl.create_default_context(cafile=self.ca) if self.ca else ssl.create_default_context()
                if cert:
                    ctx.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                files = ", ".join(f for f in (self.ca, cert, key) if f)
                raise errors.UserError(where=f"TLS files (--ca / VMCTL_CA: {files})", problem=str(exc)) from exc
            self._ssl = ctx

    # ------------------------------------------------------------------------------ plumbing

    def url_for(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        return self.url + self._target(path, query)

    def _target(self, path: str, query: Mapping[str, Any] | None) -> str:
        target = self.base_path + path
        if query:
            items = [(k, str(v)) for k, v in query.items() if v is not None]
            if items:
                target += "?" + urllib.parse.urlencode(items)
        return target

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        ok: tuple[int, ...] = (200, 201, 202, 204),
    ) -> Response:
        """Send one request; return the parsed answer or raise the vmctl error it stands for."""
        target = self._target(path, query)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._connection(self.timeout if timeout is None else timeout)
        resp: http.client.HTTPResponse | None = None
        try:
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            status = resp.status
            ctype = resp.getheader("Content-Type", "") or ""
        except ssl.SSLCertVerificationError as exc:
            reason = exc.verify_message or str(exc)
            if self.ca:
                problem = f"TLS: its certificate is not signed by the CA in {self.ca} ({reason})"
            else:
                problem = (f"TLS: its certificate is not signed by a CA this machine trusts ({reason}); no --ca "
                           f"was given")
            raise errors.TlsUntrusted(url=self.url, problem=problem) from exc
        except ssl.SSLError as exc:
            raise errors.DaemonUnavailable(url=self.url, problem=f"TLS: {exc}") from exc
        except (ConnectionResetError, http.client.BadStatusLine) as exc:
            # RemoteDisconnected is a BadStatusLine: a TLS listener drops a plain-HTTP request
            problem = str(exc) or type(exc).__name__
            if self.scheme == "http":
                problem = f"vmctld serves HTTPS only: use https://{self.url.split('://', 1)[1]} ({problem})"
            raise errors.DaemonUnavailable(url=self.url, problem=problem) from exc
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            problem = str(exc) or type(exc).__name__
            raise errors.DaemonUnavailable(url=self.url, problem=problem) from exc
        finally:
            if resp is not None:  # a read cut short (reset, timeout) leaves the response holding the socket
                resp.close()
            conn.close()
        if status not in ok:
            raise error_from_response(status, payload, self.url_for(path, query))
        if not payload:
            return Response(status, None)
        if "json" in ctype:
            try:
                return Response(status, json.loads(payload.decode("utf-8")))
            except (ValueError, UnicodeDecodeError) as exc:
                raise errors.ApiError(
                    status=status, reference_text="bad-response", problem=f"{method} {path}: invalid JSON"
                ) from exc
        return Response(status, payload.decode("utf-8", "replace"))

    def call(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None) -> Any:
        return self.raw(method, path, body, query).body

    @staticmethod
    def _seg(value: str) -> str:
        return urllib.parse.quote(str(value), safe="")

    def _field(self, doc: Any, key: str, what: str) -> Any:
        if not isinstance(doc, dict) or key not in doc:
            raise errors.ApiError(status=200, reference_text="bad-response", problem=f"{what}: no {key!r} in answer")
        return doc[key]

    # ------------------------------------------------------------------------------ jobs

    def submit_job(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self._field(self.call("POST", "/v1/jobs", dict(spec)), "job", "submit"))

    def submit_jobs(self, specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        doc = self.call("POST", "/v1/jobs:batch", {"jobs": [dict(s) for s in specs]})
        return list(self._field(doc, "jobs", "batch submit"))

    def submit(self, specs: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        """Submit one job or a batch; (the jobs, the daemon's warnings: e.g. a priority or deadline the
        active policy does not use)."""
        if len(specs) == 1:
            doc = self.call("POST", "/v1/jobs", dict(specs[0]))
            jobs = [dict(self._field(doc, "job", "submit"))]
        else:
            doc = self.call("POST", "/v1/jobs:batch", {"jobs": [dict(s) for s in specs]})
            jobs = list(self._field(doc, "jobs", "batch submit"))
        return jobs, [str(w) for w in doc.get("warnings") or ()]

    def hold_job(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        body = None if reason is None else {"reason": reason}
        return dict(self._field(self.call("POST", f"/v1/jobs/{self._seg(job_id)}/hold", body), "job", "hold"))

    def release_job(self, job_id: str) -> dict[str, Any]:
        return dict(self._field(self.call("POST", f"/v1/jobs/{self._seg(job_id)}/release"), "job", "release"))

    def requeue_job(self, job_id: str, reason: str | None = None, hold: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"hold": hold}
        if reason is not None:
            body["reason"] = reason
        return dict(self._field(self.call("POST", f"/v1/jobs/{self._seg(job_id)}/requeue", body), "job", "requeue"))

    def update_job(self, job_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change ``estimate``, ``priority`` or ``deadline`` (None: remove it) of a queued job."""
        return dict(self._field(self.call("PATCH", f"/v1/jobs/{self._seg(job_id)}", dict(changes)), "job", "update"))

    def list_jobs(self, state: str | None = None, limit: int | None = None,
                  order: str | None = None) -> list[dict[str, Any]]:
        """Jobs in submission order; ``order="newest"``: the newest first (a ``limit`` keeps those)."""
        doc = self.call("GET", "/v1/jobs", query={"state": state, "limit": limit, "order": order})
        return list(self._field(doc, "jobs", "jobs"))

    def get_job(self, job_id: str) -> dict[str, Any]:
        return dict(self._field(self.call("GET", f"/v1/jobs/{self._seg(job_id)}"), "job", "job"))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return dict(self._field(self.call("DELETE", f"/v1/jobs/{self._seg(job_id)}"), "job", "cancel"))

    def list_operations(self, job: str | None = None, state: str | None = None,
                        limit: int | None = None) -> list[dict[str, Any]]:
        doc = self.call("GET", "/v1/operations", query={"job": job, "state": state, "limit": limit})
        return list(self._field(doc, "operations", "operations"))

    def get_operation(self, op_id: str) -> dict[str, Any]:
        return dict(self._field(self.call("GET", f"/v1/operations/{self._seg(op_id)}"), "operation", "operation"))

    def explain_job(self, job_id: str) -> dict[str, Any]:
        doc = self.call("GET", f"/v1/jobs/{self._seg(job_id)}/explain")
        if not isinstance(doc, dict):
            raise errors.ApiError(status=200, reference_text="bad-response", problem="explain: not an object")
        return doc

    def migrate_job(self, job_id: str, to_node: str) -> dict[str, Any]:
        doc = self.call("POST", f"/v1/jobs/{self._seg(job_id)}/migrate", {"to_node": to_node})
        return dict(self._field(doc, "operation", "migrate"))

    def events(self, since: float | None = None, after: int | None = None, limit: int | None = None,
               wait: float | None = None) -> dict[str, Any]:
        """``GET /v1/events``: ``{"events": [...], "last_seq": N}``. Without ``after``: the newest ``limit``
        events (since ``since``); with it: the events after that ``seq``, waiting up to ``wait`` seconds
        for one (pass each answer's ``last_seq`` to follow the log)."""
        query = {"since": since, "after": after, "limit": limit, "wait": wait}
        timeout = self.timeout + (wait or 0.0)
        doc = self.raw("GET", "/v1/events", query=query, timeout=timeout).body
        self._field(doc, "events", "events")
        return dict(doc)

    # ------------------------------------------------------------------------------ nodes and VMs

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(self._field(self.call("GET", "/v1/nodes"), "nodes", "nodes"))

    def remove_node(self, name: str) -> dict[str, Any]:
        return dict(self._field(self.call("DELETE", f"/v1/nodes/{self._seg(name)}"), "node", "remove"))

    def drain_node(self, name: str, reason: str | None = None) -> dict[str, Any]:
        body = None if reason is None else {"reason": reason}
        return dict(self._field(self.call("POST", f"/v1/nodes/{self._seg(name)}/drain", body), "node", "drain"))

    def confirm_cores(self, name: str, cores: int) -> dict[str, Any]:
        """``POST /v1/nodes/<name>/cores``: confirm that the node has ``cores`` cores."""
        return dict(self._field(self.call("POST", f"/v1/nodes/{self._seg(name)}/cores", {"cores": cores}),
                                "node", "cores"))

    def undrain_node(self, name: str) -> dict[str, Any]:
        return dict(self._field(self.call("POST", f"/v1/nodes/{self._seg(name)}/undrain"), "node", "undrain"))

    def list_vms(self, node: str | None = None) -> list[dict[str, Any]]:
        return list(self._field(self.call("GET", "/v1/vms", query={"node": node}), "vms", "vms"))

    def list_workers(self, node: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/workers``: one worker per VM slot with its state (available, occupied, busy, down)."""
        return list(self._field(self.call("GET", "/v1/workers", query={"node": node}), "workers", "workers"))

    def gang(self) -> dict[str, Any]:
        """``GET /v1/gang``: the gang matrix of a timeslice cluster (rows x nodes, active row, holes)."""
        return dict(self._field(self.call("GET", "/v1/gang"), "gang", "gang"))

    def get_vm(self, name: str) -> dict[str, Any]:
        return dict(self._field(self.call("GET", f"/v1/vms/{self._seg(name)}"), "vm", "vm"))

    def set_vm_priority(self, name: str, change: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self._field(self.set_vm_priority_doc(name, change), "vm", "priority"))

    def set_vm_priority_doc(self, name: str, change: Mapping[str, Any]) -> dict[str, Any]:
        """The whole answer: ``vm`` and ``applied_to`` (the VMs the change applies to: every VM of the
        job for tier, weight and cap, the VM alone for a pin)."""
        doc = self.call("PUT", f"/v1/vms/{self._seg(name)}/priority", dict(change))
        self._field(doc, "vm", "priority")
        return dict(doc)

    # ------------------------------------------------------------------------------ policy, auth, health

    def get_policy(self) -> dict[str, Any]:
        doc = self.call("GET", "/v1/policy")
        if not isinstance(doc, dict):
            raise errors.ApiError(status=200, reference_text="bad-response", problem="policy: not an object")
        return doc

    def set_policy(self, name: str, params: Mapping[str, Any] | None = None, relayout: bool = False,
                   layout: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``PUT /v1/policy``; ``relayout``: drain, re-lay the hosts out in the policy's layout (or
        ``layout``: ``{"discipline": ..., "levels": N}``) and switch."""
        body: dict[str, Any] = {"name": name}
        if params:
            body["params"] = dict(params)
        if relayout:
            body["relayout"] = True
        if layout is not None:
            body["layout"] = dict(layout)
        doc = self.call("PUT", "/v1/policy", body)
        return doc if isinstance(doc, dict) else {}

    def cancel_policy_switch(self) -> dict[str, Any]:
        """``DELETE /v1/policy/switch``: end the switch in progress (the old policy goes on)."""
        doc = self.call("DELETE", "/v1/policy/switch")
        return doc if isinstance(doc, dict) else {}

    def plan(self, instance: Mapping[str, Any], policy: str, params: Mapping[str, Any] | None = None
             ) -> dict[str, Any]:
        """``POST /v1/plan``: the plan of ``policy`` for an instance document; nothing is applied."""
        doc = self.call("POST", "/v1/plan", {**instance, "policy": policy, "params": dict(params or {})})
        return doc if isinstance(doc, dict) else {}

    def list_tokens(self) -> list[dict[str, Any]]:
        return list(self._field(self.call("GET", "/v1/tokens"), "tokens", "token list"))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return dict(self._field(self.call("DELETE", f"/v1/tokens/{self._seg(token_id)}"), "token", "token revoke"))

    def issue_token(self, name: str, role: str, ttl_s: float | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "role": role}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        doc = self.call("POST", "/v1/tokens", body)
        self._field(doc, "token", "token issue")
        return dict(doc)

    def issue_cert(self, node: str, csr_pem: str | None = None) -> dict[str, Any]:
        """With ``csr_pem`` vmctld signs the request (the answer has no key); without, it makes the key."""
        body = {"node": node} if csr_pem is None else {"node": node, "csr_pem": csr_pem}
        doc = self.call("POST", "/v1/certs", body)
        for key in ("cert_pem", "ca_pem") if csr_pem is not None else ("cert_pem", "key_pem", "ca_pem"):
            self._field(doc, key, "cert issue")
        return dict(doc)

    def list_certs(self) -> list[dict[str, Any]]:
        return list(self._field(self.call("GET", "/v1/certs"), "certs", "cert list"))

    def revoke_cert(self, key: str) -> list[dict[str, Any]]:
        return list(self._field(self.call("DELETE", f"/v1/certs/{self._seg(key)}"), "revoked", "cert revoke"))

    def ca_info(self) -> dict[str, Any]:
        """``GET /v1/ca``: the cluster's CAs (fingerprints) and where each node stands in a rotation."""
        doc = self.call("GET", "/v1/ca")
        self._field(doc, "fingerprint", "ca show")
        return dict(doc)

    def rotate_ca(self) -> dict[str, Any]:
        doc = self.call("POST", "/v1/ca/rotate", {})
        self._field(doc, "fingerprint", "ca rotate")
        return dict(doc)

    def finish_ca(self, force: bool = False) -> dict[str, Any]:
        doc = self.call("POST", "/v1/ca/finish", {"force": force})
        self._field(doc, "fingerprint", "ca finish")
        return dict(doc)

    def health(self) -> dict[str, Any]:
        doc = self.call("GET", "/v1/health")
        return doc if isinstance(doc, dict) else {}

    def metrics_text(self) -> str:
        body = self.raw("GET", "/metrics").body
        return body if isinstance(body, str) else json.dumps(body)
