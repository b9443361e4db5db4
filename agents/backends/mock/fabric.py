"""Migrations of mock VMs: in one process through a ``MockFabric``, between processes through a shared
directory.

Two ``MockBackend`` objects that share a ``MockFabric`` can migrate VMs between them (live: the VM
keeps running on the source for ``migration_seconds`` and then moves with its process; or by
checkpoint file and restore, ``store.py``).

Between processes (one agent per mock host, as in ``vmctl demo``) the fabric is a shared directory,
``fabric_dir``: every backend owns an inbox ``<fabric_dir>/<uri as a file name>/``. A live migration
to a host that is not in this process runs on the source for ``migration_seconds`` and then hands
off: the source writes the VM's state (spec, pinning, weight, cap, CPU time, job process progress)
atomically to ``<target inbox>/<vm>.json`` and freezes the VM (still MIGRATING). The target picks it
up on its next call (or poll, ``poll_seconds``): it claims the file by renaming it and adopts the VM,
running; or, if it already has a live VM of that name or cannot read the file, it answers with
``<vm>.rejected`` (the reason) and deletes the offer. The source then sees the offer gone: COMPLETED
(VM removed here) or, with a ``.rejected`` answer, FAILED (the VM runs on here). ``start_migration(...,
metadata=...)`` entries are merged into the metadata of the copy the target adopts (in-process and in
the offer file), so the VM names its new host from its arrival; ``set_metadata`` merges entries into a
VM's metadata (kept in the state file). ``abort_migration``
deletes an unclaimed offer; a claimed one completes. With ``poll_seconds`` a thread settles the
model that often and emits events for arrivals, hand-offs and process exits, so agents wake at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

from vmctl.agents.backends.base import MigrationState
from vmctl.agents.backends.mock.host import MockHost, MockMigration, MockVm
from vmctl.agents.backends.mock.store import vm_from_state, vm_state, write_json, write_text
from vmctl.errors import HypervisorError
from vmctl.nodedoc import PowerState

log = logging.getLogger("vmctl.agent.mock")


def inbox_name(uri: str) -> str:
    """The fabric-directory inbox of a host URI (``mock://node2`` -> ``mock_node2``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in uri.replace("://", "_")) or "_"


class FabricMigrations(MockHost):
    """The migration part of ``MockBackend``: due migrations complete, in process or through the fabric
    directory (see the module docstring)."""

    def _finish_migrations(self, now: float) -> None:
        in_process: list[MockMigration] = []
        with self._lock:
            for mig in self._migrations.values():
                if mig.state is not MigrationState.RUNNING or now < mig.started + mig.duration:
                    continue
                vm = self._vms.get(mig.name)
                if vm is None:
                    mig.state, mig.error = MigrationState.FAILED, "VM vanished"
                elif mig.target is None:
                    self._remote_step(mig, vm, now)
                else:
                    in_process.append(mig)
        for mig in in_process:
            self._hand_over(mig, now)

    def _hand_over(self, mig: MockMigration, now: float) -> None:
        """Move a migrated VM to an in-process target, under the fabric's one lock (both backends
        share it). Events go out after the lock."""
        target = mig.target
        assert target is not None
        with self._lock:
            vm = self._vms.get(mig.name)
            if mig.state is not MigrationState.RUNNING or vm is None:
                return  # settled meanwhile (aborted, or handled by a concurrent pass)
            target._advance(now)
            if mig.name in target._vms:
                mig.state, mig.error = MigrationState.FAILED, "target already has a VM of that name"
                vm.power = PowerState.RUNNING
                return
            del self._vms[mig.name]
            vm.power = PowerState.RUNNING
            vm.alloc = 0.0
            if mig.metadata:  # it names its new host from the moment it is there
                vm.spec = replace(vm.spec, metadata={**vm.spec.metadata, **mig.metadata})
            if vm.pinned is not None and max(vm.pinned) >= target.cores:
                vm.pinned = None
            target._vms[mig.name] = vm
            mig.state, mig.finished = MigrationState.COMPLETED, now
            self._invalidate()
            self._log("migration_completed", mig.name, target.uri)
            target._log("migration_arrived", mig.name, self.uri)
            target._invalidate()
        self._emit(mig.name, "migrated", f"to {target.uri}")
        target._emit(mig.name, "started", f"migrated from {self.uri}")

    def _remote_step(self, mig: MockMigration, vm: MockVm, now: float) -> None:
        """A migration to another process: hand the VM off once its time is up, then wait for the
        target's answer (offer claimed: completed; ``.rejected``: failed)."""
        assert self.fabric_dir is not None
        target_dir = self.fabric_dir / inbox_name(mig.target_uri)
        if mig.offer is None:
            offer = target_dir / f"{mig.name}.json"
            try:
                handed = vm_state(vm, self.hostname, now)
                if mig.metadata:  # the copy on the target names its new host; this one stays as it was
                    handed["spec"] = {**handed["spec"], "metadata": {**handed["spec"]["metadata"], **mig.metadata}}
                write_json(offer, {**handed, "migration": {"from": self.uri, "to": mig.target_uri, "time": now}})
            except OSError as exc:
                mig.state, mig.error, mig.finished = MigrationState.FAILED, f"cannot hand off to {offer}: {exc}", now
                vm.power = PowerState.RUNNING
                self._invalidate()
                self._log("migration_failed", mig.name, mig.error, ok=False)
                self._emit(mig.name, "migration_failed", mig.error)
                return
            mig.offer = offer
            vm.frozen = True
            self._invalidate()
            self._log("migration_handoff", mig.name, str(offer))
            return
        if mig.offer.exists():
            return  # not picked up yet
        rejected = mig.offer.with_suffix(".rejected")
        if rejected.exists():
            try:
                why = rejected.read_text(encoding="utf-8").strip() or "rejected"
                rejected.unlink()
            except OSError as exc:
                why = f"rejected (unreadable answer: {exc})"
            mig.state, mig.error, mig.finished = MigrationState.FAILED, f"{mig.target_uri}: {why}", now
            vm.frozen = False
            vm.power = PowerState.RUNNING
            self._invalidate()
            self._log("migration_failed", mig.name, mig.error, ok=False)
            self._emit(mig.name, "migration_failed", mig.error)
            return
        del self._vms[mig.name]
        mig.state, mig.finished = MigrationState.COMPLETED, now
        self._invalidate()
        self._log("migration_completed", mig.name, mig.target_uri)
        self._emit(mig.name, "migrated", f"to {mig.target_uri}")

    def _receive(self, now: float) -> None:
        """Adopt the VMs other processes handed to this host (see the module docstring)."""
        assert self.inbox is not None
        try:
            offers = sorted(self.inbox.glob("*.json"))
        except OSError:
            return
        for offer in offers:
            name = offer.stem
            with self._lock:
                try:
                    state = json.loads(offer.read_text(encoding="utf-8"))
                    vm = vm_from_state(state, str(offer))
                except FileNotFoundError:
                    continue  # withdrawn (aborted) meanwhile
                except (OSError, ValueError, HypervisorError) as exc:
                    self._reject(offer, f"cannot read the migration state: {exc}")
                    continue
                existing = self._vms.get(name)
                if vm.spec.name != name:
                    self._reject(offer, f"the offer holds VM {vm.spec.name!r}, not {name!r}")
                    continue
                if existing is not None and existing.power in (PowerState.RUNNING, PowerState.PAUSED,
                                                               PowerState.MIGRATING):
                    self._reject(offer, f"{self.hostname} already has a {existing.power.value} VM {name}")
                    continue
                claimed = offer.with_name(f"{offer.name}.claimed-{os.getpid()}")
                try:
                    os.rename(offer, claimed)
                except FileNotFoundError:
                    continue  # the source aborted first
                except OSError as exc:
                    self._log("migration_arrived", name, f"cannot claim {offer}: {exc}", ok=False)
                    continue
                self._advance(now)
                if vm.pinned is not None and max(vm.pinned) >= self.cores:
                    vm.pinned = None
                vm.power = PowerState.RUNNING
                self._vms[name] = vm
                self._invalidate()
                source = str(state.get("migration", {}).get("from", "?"))
                self._log("migration_arrived", name, source)  # saved before the claimed offer goes
                if self._unsaved is None:  # else a restarted agent adopts it from the claimed file
                    with contextlib.suppress(OSError):
                        claimed.unlink()
            self._emit(name, "started", f"migrated from {source}")

    def _reject(self, offer: Path, why: str) -> None:
        try:
            write_text(offer.with_suffix(".rejected"), why)
            offer.unlink()
        except FileNotFoundError:  # the source withdrew the offer meanwhile: no answer needed
            with contextlib.suppress(OSError):
                offer.with_suffix(".rejected").unlink()
            return
        except OSError:
            return
        self._log("migration_rejected", offer.stem, why, ok=False)

    def _adopt_claimed(self) -> None:
        """An earlier life of this host claimed a migration offer (renamed it) and died before it had
        saved the VM: adopt the VM now (the source already considers it gone; it made no progress
        since the hand-off, as while an offer waits)."""
        if self.inbox is None:
            return
        try:
            leftovers = sorted(self.inbox.glob("*.json.claimed-*"))
        except OSError:
            return
        for claimed in leftovers:
            name = claimed.name.split(".json.claimed-", 1)[0]
            if name not in self._vms:
                try:
                    vm = vm_from_state(json.loads(claimed.read_text(encoding="utf-8")), str(claimed))
                except (OSError, ValueError, HypervisorError) as exc:
                    log.error("mock host %s: cannot adopt the claimed migration %s: %s", self.uri, claimed, exc)
                    continue
                if vm.pinned is not None and max(vm.pinned) >= self.cores:
                    vm.pinned = None
                vm.power = PowerState.RUNNING
                self._vms[vm.spec.name] = vm
                self._dirty = True
                self._log("migration_arrived", vm.spec.name, f"claimed by an earlier agent ({claimed.name})")
            with contextlib.suppress(OSError):
                claimed.unlink()
