"""ARCHITECTURE.md's import boundaries, checked on the source (static AST scan of every module)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


ALLOWED_POLICY_PREFIXES = (
    "vmctl.model", "vmctl.errors", "vmctl.policies", "numpy", "scipy", "highspy", "__future__",
)
STDLIB_FORBIDDEN_IN_POLICIES = {"time", "random", "os", "socket", "subprocess", "sqlite3", "threading", "pathlib"}


@pytest.mark.parametrize("path", _files("policies"), ids=lambda p: str(p.relative_to(ROOT)))
def test_policies_are_pure(path: Path) -> None:
    import sys

    for mod in _imports(path):
        top = mod.split(".")[0]
        if top in sys.stdlib_module_names:
            assert top not in STDLIB_FORBIDDEN_IN_POLICIES, f"{path.name} imports {mod} (no I/O, clock or global RNG)"
            continue
        assert mod.startswith(ALLOWED_POLICY_PREFIXES), f"{path.name} imports {mod}"


@pytest.mark.parametrize("path", _files("agents"), ids=lambda p: str(p.relative_to(ROOT)))
def test_agents_never_import_policies_or_daemon(path: Path) -> None:
    rel = path.relative_to(ROOT).as_posix()
    for mod in _imports(path):
        assert not mod.startswith(("vmctl.policies", "vmctl.daemon", "vmctl.sim")), f"{rel} imports {mod}"
        if mod == "libvirt" or mod.startswith("libvirt."):
            assert rel.startswith("agents/backends/libvirt"), f"only agents/backends/libvirt may import libvirt: {rel}"


@pytest.mark.parametrize("path", _files("vmctl/sim"), ids=lambda p: str(p.relative_to(ROOT)))
def test_sim_never_imports_agents_or_daemon(path: Path) -> None:
    for mod in _imports(path):
        forbidden = ("vmctl.agents", "vmctl.daemon", "vmctl.store", "vmctl.api")
        assert not mod.startswith(forbidden), f"{path.name} imports {mod}"


# Offline commands may load what they check or start (ARCHITECTURE.md: "except offline commands"):
# `vmctl config check` parses daemon/agent configs; `vmctl demo` starts a daemon and agents itself.
CLI_OFFLINE_ALLOWED = {
    "config_cmd.py": ("vmctl.daemon.config", "vmctl.agents.config"),
    "demo.py": ("vmctl.daemon.config", "vmctl.daemon.main", "vmctl.agents"),
}


def test_cli_talks_to_daemon_only_through_api() -> None:
    for path in _files("vmctl/cli"):
        allowed = CLI_OFFLINE_ALLOWED.get(path.name, ())
        for mod in _imports(path):  # ast.walk: function-local imports count too
            if allowed and mod.startswith(allowed):
                continue
            assert not mod.startswith(("vmctl.daemon", "vmctl.store", "vmctl.agents")), f"{path.name} imports {mod}"


def test_package_links_point_at_top_level_folders() -> None:
    assert (ROOT / "vmctl" / "policies").resolve() == (ROOT / "policies").resolve()
    assert (ROOT / "vmctl" / "agents").resolve() == (ROOT / "agents").resolve()
