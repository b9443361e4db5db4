"""Backend registry of the ONE contract suite (``test_backend_contract.py``).

Every module ``tests/contract/backends_*.py`` next to this file is imported and may contribute
backends, without editing this file or the suite:

    FACTORIES: dict[str, Callable[[Path], Harness]]    # id -> factory(tmp_path)
    MARKS: dict[str, list[pytest.MarkDecorator]]      # optional, e.g. {"libvirt-qemu": [pytest.mark.libvirt]}

A factory may call ``pytest.skip("reason")`` when its hypervisor is missing. It returns a *harness*:
any object with these attributes (a dataclass of your own or ``types.SimpleNamespace``):

- ``backend``: the ``HypervisorBackend`` under test (fresh, no VMs named ``ct-*``)
- ``spec(name) -> VmSpec``: a spec this backend can boot (image, memory)
- ``wait(seconds)``: let time pass (mock: advance its virtual clock; real backends: sleep)
- ``peer``: a second backend the first can live-migrate to, or None (migration tests skip)
- ``peer_uri``: ``dest_uri`` for ``start_migration`` to ``peer``; ``migrate_uri``: str or None
- ``cpu_stats_real``: True when ``cpu_time_s`` of a busy VM really grows (not fake numbers)
- ``busy_spec(name) -> VmSpec | None``: a guest that spins at 100 % (None: cannot make one);
  optional ``make_busy(name)``: called after it started (the mock starts a spinning process there)
- ``close()``: remove what the test left behind (VMs named ``ct-*``) and release connections

``backends_mock.py`` registers the in-memory mock in two variants (full and minimal capabilities).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).parent


def _load_registry() -> list[tuple[str, Callable[[Path], Any], list[pytest.MarkDecorator]]]:
    out: list[tuple[str, Callable[[Path], Any], list[pytest.MarkDecorator]]] = []
    for path in sorted(_HERE.glob("backends_*.py")):
        name = f"vmctl_contract_{path.stem}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        factories: dict[str, Callable[[Path], Any]] = getattr(module, "FACTORIES", {})
        marks: dict[str, list[pytest.MarkDecorator]] = getattr(module, "MARKS", {})
        for key, factory in factories.items():
            if any(key == k for k, _, _ in out):
                raise RuntimeError(f"{path.name}: contract backend id {key!r} is already registered")
            out.append((key, factory, list(marks.get(key, []))))
    return out


REGISTRY = _load_registry()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" in metafunc.fixturenames:
        metafunc.parametrize(
            "harness_factory",
            [pytest.param(factory, id=key, marks=marks) for key, factory, marks in REGISTRY],
        )


@pytest.fixture
def harness(harness_factory: Callable[[Path], Any], tmp_path: Path) -> Iterator[Any]:
    h = harness_factory(tmp_path)
    try:
        yield h
    finally:
        h.close()
