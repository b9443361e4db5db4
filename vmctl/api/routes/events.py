"""The event log: ``GET /v1/events`` (``vmctl events``), with a long poll to follow it."""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from vmctl import timefmt
from vmctl.api.documents import event_json
from vmctl.api.plumbing import json_response, query_float, query_int
from vmctl.api.routes.base import Routes
from vmctl.errors import ValidationError

#: the most events one answer carries
MAX_EVENTS = 10000


def parse_since(raw: str | None) -> float | None:
    """``since``: epoch seconds, or an ISO 8601 time (``2026-11-25T04:05:06Z``; without a zone: UTC)."""
    if raw is None:
        return None
    try:
        return timefmt.parse_time(raw, local=False)
    except ValueError as exc:
        raise ValidationError(field="since", problem=str(exc)) from exc


class EventRoutes(Routes):
    async def list_events(self, request: web.Request) -> web.Response:
        """Events in order. Without ``after``: the newest ``limit`` events since ``since`` (a tail). With
        ``after=SEQ``: the first ``limit`` events after that one, waiting up to ``wait`` seconds for one
        to happen when there is none yet (follow the log by passing the ``last_seq`` of each answer)."""
        self._leader()
        q = request.query
        since = parse_since(q.get("since"))
        follow = "after" in q
        after = query_int(q.get("after"), "after", 0, 2**62, 0)
        limit = query_int(q.get("limit"), "limit", 1, MAX_EVENTS, 1000)
        wait = query_float(q.get("wait"), "wait", 0.0, 60.0, 0.0)
        if wait and not follow:
            raise ValidationError(field="wait", problem="needs after=SEQ (the last_seq of an earlier answer)")
        deadline = time.monotonic() + wait
        while True:
            ev = self.rt.log_event()  # before the read: an event written after it sets this
            try:
                found = self.d.store.list_events(after=after, since=since, limit=limit, newest=not follow)
                left = deadline - time.monotonic()
                if found or left <= 0 or self.rt.stopping:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ev, timeout=left)
            finally:
                self.rt.log_unwatch(ev)
            self._leader()
        last = found[-1].seq if found else (after if follow else self.d.events.next_seq - 1)
        return json_response({"events": [event_json(e) for e in found], "last_seq": last})
