"""``POST /v1/plan`` off the event loop: planning in worker processes, bounded per token.

A plan is pure computation on the request's own document (the dispatch policies of paper 001,
``vmctl.policies.dispatch``), which any token may ask for, a read token too. Parsed, validated and
planned on the event loop (or in a thread, which holds the interpreter lock just the same), four
clients looping a 0.54 MB instance raised ``/healthz`` p50 from 6 to 411 ms (issue 23). Here:

- the body (bytes, already bounded by ``api.max_body_bytes``: 413) goes to a worker process that
  parses, validates and plans it: nothing of it is decoded on the event loop. The workers run at a
  lower CPU priority (``nice`` + ``WORKER_NICE``): the daemon's own loop comes first;
- each token (or agent) has at most ``api.plan_per_token`` plans in progress, and at most
  ``api.plan_queue`` plans are in progress or waiting for a worker in all; beyond either the answer
  is 429 with ``Retry-After`` (seconds, from the recent plan times) and no work is done;
- the pool (``api.plan_workers`` processes, started at the first plan) is shut down with the server;
  a worker that dies is replaced at the next plan and its request answered 503.

A bad document is still answered as before, a 422 naming the field (the worker returns the error's
class and fields, not the error: nothing but plain data crosses the process boundary).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import math
import multiprocessing
import os
import time
from collections import Counter
from typing import Any

from vmctl.api import schemas
from vmctl.errors import ValidationError, VmctlError

#: how much lower the workers' CPU priority is than the daemon's (``os.nice``)
WORKER_NICE = 10


class PlanBusy(VmctlError):
    """Too many plans in progress for this token, or in all (429 with ``Retry-After``)."""

    reference = "plan-busy"
    template = "{problem}; retry after {retry_after} s"
    http_status = 429
    retryable = True


class PlanFailed(VmctlError):
    reference = "plan-unavailable"
    template = "{problem}"
    http_status = 503
    retryable = True


def _lower_priority() -> None:
    with contextlib.suppress(OSError):  # not allowed (a container): plan at the same priority
        os.nice(WORKER_NICE)


def plan_document(raw: bytes) -> tuple[str, Any]:
    """In a worker: parse, validate and plan one request body. ``("ok", answer)`` or
    ``("error", (module, class name, fields))`` of the ``VmctlError`` it raised (rebuilt by
    ``_rebuild``); anything else raised is a defect and travels as it is."""
    from vmctl.policies.dispatch import load_instance, plan, policy_params

    try:
        body = schemas.parse_body(raw)
        if not isinstance(body, dict):
            raise ValidationError(field="body", problem=f"must be an object, got {schemas.type_name(body)}")
        policy = schemas.string(body, "policy", "", required=True, max_len=100, name=True)
        assert policy is not None
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise ValidationError(field="params", problem=f"must be an object, got {schemas.type_name(params)}")
        resolved = policy_params(policy, params)
        workers, jobs = load_instance({k: v for k, v in body.items() if k not in ("policy", "params")}, "body")
        t0 = time.perf_counter()
        result = plan(policy, workers, jobs, 0.0, resolved)
        return "ok", {**result.to_dict(), "policy": policy, "params": resolved,
                      "run_time_s": time.perf_counter() - t0}
    except VmctlError as exc:
        cls = type(exc)
        fields = {k: (v if isinstance(v, str | int | float | bool) or v is None else str(v))
                  for k, v in exc.fields.items()}
        return "error", (cls.__module__, cls.__qualname__, fields, str(exc))


def _rebuild(module: str, name: str, fields: dict[str, Any], message: str) -> VmctlError:
    """The worker's error, as it would have been raised here (same class, same fields)."""
    try:
        err = getattr(importlib.import_module(module), name)(**fields)
        if isinstance(err, VmctlError):
            return err
    except (ImportError, AttributeError, TypeError):
        pass
    return ValidationError(field=fields.get("field") or "body", problem=message)


class Planner:
    """The worker pool and the admission bounds of the module docstring."""

    def __init__(self, workers: int, per_token: int, queue: int,
                 executor: concurrent.futures.Executor | None = None) -> None:
        """``executor`` replaces the process pool (tests hold plans in progress with it)."""
        self.workers = workers
        self.per_token = per_token
        self.queue = queue
        self._pool: concurrent.futures.Executor | None = executor
        self._by_token: Counter[str] = Counter()
        self._in_progress = 0
        #: the last plan's wall time (admission to answer), for Retry-After
        self._last_s = 1.0
        self.refused = 0

    @property
    def in_progress(self) -> int:
        return self._in_progress

    def _executor(self) -> concurrent.futures.Executor:
        if self._pool is None:
            # spawn: a fork of a running daemon (threads, sockets, the store's connections) is not safe
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_lower_priority)
        return self._pool

    def _retry_after(self) -> int:
        waiting = max(1, self._in_progress - self.workers + 1)
        return max(1, math.ceil(self._last_s * waiting / self.workers))

    async def run(self, who: str, raw: bytes) -> dict[str, Any]:
        """The answer to ``POST /v1/plan`` of principal ``who`` with body ``raw`` (PlanBusy,
        ValidationError or PlanFailed otherwise)."""
        if self._by_token[who] >= self.per_token:
            self.refused += 1
            raise PlanBusy(problem=f"{who} has {self._by_token[who]} plan(s) in progress (at most "
                                   f"{self.per_token} at once: api.plan_per_token)", retry_after=self._retry_after())
        if self._in_progress >= self.queue:
            self.refused += 1
            raise PlanBusy(problem=f"{self._in_progress} plans in progress or waiting (at most {self.queue}: "
                                   "api.plan_queue)", retry_after=self._retry_after())
        self._by_token[who] += 1
        self._in_progress += 1
        t0 = time.monotonic()
        try:
            pool = self._executor()
            try:
                kind, out = await asyncio.wrap_future(pool.submit(plan_document, raw))
            except concurrent.futures.process.BrokenProcessPool as exc:
                self._discard(pool)
                raise PlanFailed(problem="a planning worker died; ask again") from exc
        finally:
            self._by_token[who] -= 1
            if self._by_token[who] <= 0:
                del self._by_token[who]
            self._in_progress -= 1
        self._last_s = time.monotonic() - t0
        if kind == "error":
            raise _rebuild(*out)
        assert isinstance(out, dict)
        return out

    def _discard(self, pool: concurrent.futures.Executor) -> None:
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
