"""libvirt's default event loop, run once per process in a daemon thread, and the mapping of
lifecycle events to vmctl's ``BackendEvent`` kinds.

libvirt needs an event loop implementation registered BEFORE a connection is opened for keepalive
and domain events to work; ``ensure_event_loop()`` registers the default one exactly once and runs
``virEventRunDefaultImpl`` forever in a daemon thread named ``libvirt-events``.
"""

from __future__ import annotations

import logging
import threading

import libvirt

log = logging.getLogger(__name__)

_lock = threading.Lock()
_thread: threading.Thread | None = None

# (event, detail) -> kind; (event, None) is the fallback for any detail.
_KINDS: dict[tuple[int, int | None], str] = {
    (libvirt.VIR_DOMAIN_EVENT_DEFINED, None): "defined",
    (libvirt.VIR_DOMAIN_EVENT_UNDEFINED, None): "undefined",
    (libvirt.VIR_DOMAIN_EVENT_STARTED, None): "started",
    (libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_RESTORED): "restored",
    (libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_FROM_SNAPSHOT): "restored",
    (libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_MIGRATED): "migrated",
    (libvirt.VIR_DOMAIN_EVENT_SUSPENDED, None): "suspended",
    (libvirt.VIR_DOMAIN_EVENT_SUSPENDED, libvirt.VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED): "migrating",
    (libvirt.VIR_DOMAIN_EVENT_RESUMED, None): "resumed",
    (libvirt.VIR_DOMAIN_EVENT_RESUMED, libvirt.VIR_DOMAIN_EVENT_RESUMED_MIGRATED): "migrated",
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, None): "stopped",
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_SAVED): "saved",
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_MIGRATED): "migrated",
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_CRASHED): "crashed",
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_FAILED): "crashed",
    (libvirt.VIR_DOMAIN_EVENT_SHUTDOWN, None): "stopping",
    (libvirt.VIR_DOMAIN_EVENT_CRASHED, None): "crashed",
    (libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED, None): "suspended",
}


def lifecycle_kind(event: int, detail: int) -> str:
    """The BackendEvent kind of a libvirt lifecycle (event, detail) pair."""
    return _KINDS.get((event, detail)) or _KINDS.get((event, None)) or f"event-{event}"


def _run() -> None:
    while True:
        try:
            libvirt.virEventRunDefaultImpl()
        except Exception:  # keep the loop alive whatever one callback does
            log.exception("libvirt event loop iteration failed")


def _quiet(ctx: object, err: object) -> None:
    log.debug("libvirt: %s", err)


def ensure_event_loop() -> None:
    """Register libvirt's default event loop implementation once and start its thread."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        libvirt.virEventRegisterDefaultImpl()
        # libvirt prints every error to stderr by default; vmctl translates and reports them itself.
        libvirt.registerErrorHandler(_quiet, None)
        _thread = threading.Thread(target=_run, name="libvirt-events", daemon=True)
        _thread.start()
