"""Admin routes: API tokens and agent certificates."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from vmctl import auth
from vmctl.api import schemas
from vmctl.api.documents import TOKEN_ID_LEN, cert_json, token_json
from vmctl.api.plumbing import json_response, read_json
from vmctl.api.routes.base import Routes
from vmctl.api.security import add_token, begin_rotation, finish_rotation
from vmctl.errors import Conflict, NotFound, ValidationError
from vmctl.store.base import WriteBatch

log = logging.getLogger("vmctld.api")


class AdminRoutes(Routes):
    async def create_token(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("name", "role", "ttl_s"))
        name = schemas.string(body, "name", "", required=True, max_len=100, name=True)
        role = schemas.string(body, "role", "", required=True)
        if role not in auth.ROLES:
            raise ValidationError(field="role", problem=f"must be one of {', '.join(auth.ROLES)}, got {role!r}")
        ttl = schemas.number(body, "ttl_s", "", lo=1.0, hi=schemas.MAX_SECONDS)
        assert name is not None and role is not None
        token, rec = add_token(self.d, name, role, ttl)
        return json_response({"token": token, "name": rec.name, "role": rec.role, "expires": rec.expires}, 201)

    async def list_tokens(self, request: web.Request) -> web.Response:
        self._leader()
        return json_response({"tokens": [token_json(t) for t in self.d.store.list_tokens()]})

    async def revoke_token(self, request: web.Request) -> web.Response:
        """Revoke by id (the first 12 hex digits of its hash, as listed) or by name when one token has it."""
        self._leader()
        key = request.match_info["id"]
        tokens = self.d.store.list_tokens()
        hit = [t for t in tokens if t.hash[:TOKEN_ID_LEN] == key] or [t for t in tokens if t.name == key]
        if not hit:
            raise NotFound(kind="token", name=key)
        if len(hit) > 1:
            ids = ", ".join(t.hash[:TOKEN_ID_LEN] for t in hit)
            raise Conflict(what=f"token name {key!r}", problem=f"{len(hit)} tokens have it: revoke one by id ({ids})")
        t = hit[0]
        now = time.time()
        admins = [x for x in tokens if x.role == "admin" and (x.expires is None or x.expires > now)]
        if t.role == "admin" and admins == [t]:
            raise Conflict(what=f"token {t.name!r}", problem="it is the last admin token: issue another one first")
        self.d.store.write(self.d.epoch, WriteBatch(delete_tokens=[t.hash]))
        log.info("token %r (%s, id %s) revoked", t.name, t.role, t.hash[:TOKEN_ID_LEN])
        return json_response({"token": token_json(t)})

    async def create_cert(self, request: web.Request) -> web.Response:
        """With ``csr_pem`` (what ``vmctl cert issue`` sends) vmctld signs the request's key and the
        private key never travels; without it vmctld makes the key too and answers it once."""
        self._leader()
        body = schemas.obj(await read_json(request), ("node", "csr_pem"))
        node = auth.check_node_name(body.get("node"), "node")
        csr = schemas.string(body, "csr_pem", "", max_len=20_000)
        ca, bundle = self.s.ca_state.current, self.s.ca_state.bundle_pem()
        if csr is not None:
            cert = ca.sign_csr(csr, auth.NODE_CN_PREFIX + node)
            serial = self.s.certs.issued(node, cert, "csr", ca.fingerprint())
            out = {"cert_pem": cert, "ca_pem": bundle, "serial": serial}
        else:
            cert, key = ca.issue(auth.NODE_CN_PREFIX + node)
            serial = self.s.certs.issued(node, cert, "vmctld", ca.fingerprint())
            out = {"cert_pem": cert, "key_pem": key, "ca_pem": bundle, "serial": serial}
        log.info("issued agent certificate %s for node %s (key made by %s)", serial, node,
                 "the requester" if csr is not None else "vmctld")
        return json_response(out, 201)

    async def list_certs(self, request: web.Request) -> web.Response:
        self._leader()
        entries = self.s.certs.entries(fresh=True)
        def order(item: tuple[str, dict[str, object]]) -> tuple[str, float]:
            issued = item[1].get("issued")
            return str(item[1].get("node", "")), float(issued) if isinstance(issued, int | float) else 0.0

        return json_response({"certs": [cert_json(serial, e) for serial, e in sorted(entries.items(), key=order)]})

    async def revoke_cert(self, request: web.Request) -> web.Response:
        """Revoke by serial (as listed), or every valid certificate of a node by its name."""
        self._leader()
        key = request.match_info["key"]
        revoked = self.s.certs.revoke(key)
        entries = self.s.certs.entries()
        return json_response({"revoked": [cert_json(s, entries[s]) for s in revoked]})

    async def get_ca(self, request: web.Request) -> web.Response:
        """The cluster's CAs (fingerprints only) and, per node, where its agent stands in a rotation."""
        self._leader()
        return json_response(self._ca_doc())

    def _ca_doc(self) -> dict[str, object]:
        return {**self.s.ca_state.doc(), "nodes": self.s.certs.rotation_status(self.s.ca_state)}

    async def rotate_ca(self, request: web.Request) -> web.Response:
        """Start a CA rotation (``vmctl ca rotate``)."""
        self._leader()
        schemas.obj(await read_json(request), ())
        self.s.apply_ca(begin_rotation(self.d, self.s.ca_state, self.s.certs))
        return json_response(self._ca_doc())

    async def finish_ca(self, request: web.Request) -> web.Response:
        """Drop the previous CA (``vmctl ca finish [--force]``)."""
        self._leader()
        body = schemas.obj(await read_json(request), ("force",))
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise ValidationError(field="force", problem=f"must be true or false, got {force!r}")
        state, retired = finish_rotation(self.d, self.s.ca_state, self.s.certs, force)
        self.s.apply_ca(state)
        return json_response({**self._ca_doc(), "retired_certs": retired})
