"""A built wheel carries the whole product: the agent and the policies (top-level folders installed as
vmctl.agents and vmctl.policies) and the data files the code reads (schema migrations, OpenAPI)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_agent_the_policies_and_the_data(tmp_path: Path) -> None:
    try:
        import setuptools  # noqa: F401 - the build backend, used without isolation (no network here)
    except ImportError:  # pragma: no cover - the README's setup installs it
        pytest.skip("setuptools is not installed in this environment")
    # from a copy of the tracked files: a build/ left in the checkout would be packed as it is
    src = tmp_path / "src"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    for rel in filter(None, listed.stdout.decode().split("\0")):
        here, there = ROOT / rel, src / rel
        there.parent.mkdir(parents=True, exist_ok=True)
        if here.is_symlink():
            there.symlink_to(here.readlink())
        elif here.exists():
            shutil.copy2(here, there)
    out = tmp_path / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("vmctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in ("vmctl/agents/main.py", "vmctl/agents/backends/mock/backend.py",
                 "vmctl/agents/backends/libvirt/backend.py", "vmctl/policies/registry.py",
                 "vmctl/policies/moldable/hsret.py", "vmctl/daemon/main.py", "vmctl/api/openapi.yaml",
                 "vmctl/store/schema/001_initial.sql", "vmctl/py.typed"):
        assert want in names, f"{want} is not in {wheel.name}"
    schemas = sorted(p.name for p in (ROOT / "vmctl" / "store" / "schema").glob("*.sql"))
    assert all(f"vmctl/store/schema/{s}" in names for s in schemas)
