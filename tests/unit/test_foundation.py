"""Model validation, the error tree, config loading, the registry and the CLI's error mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmctl import errors
from vmctl.clock import ScaledClock, VirtualClock
from vmctl.config import Section, load_yaml, parse_yaml
from vmctl.model import Job
from vmctl.policies.registry import create_policy


def test_job_validation_names_field() -> None:
    with pytest.raises(errors.ValidationError, match=r"job 7\.procs: must be > 0"):
        Job(id="7", submit_time=0, procs=0, estimate=10)
    with pytest.raises(errors.ValidationError, match="cpu_usage"):
        Job(id="8", submit_time=0, procs=2, estimate=10, cpu_usage=(0.5,))
    with pytest.raises(errors.ValidationError, match="estimate"):
        Job(id="9", submit_time=0, procs=1, estimate=float("nan"))
    assert Job(id="1", submit_time=0, procs=2, estimate=5).usage_of(1) == 1.0


def test_error_messages_and_dict() -> None:
    e = errors.TraceFormatError(path="x.swf", line=4, problem="bad")
    assert str(e) == "x.swf:4: bad"
    assert str(errors.TraceFormatError(path="x.swf", line=0, problem="no such file")) == "x.swf: no such file"
    d = e.to_dict()
    assert d["reference"] == "trace-format" and d["line"] == 4 and d["retryable"] is False
    assert errors.HypervisorUnavailable(backend="libvirt", uri="qemu:///system", problem="x").retryable


def test_all_references_unique_and_kebab() -> None:
    import re

    seen: dict[str, type] = {}

    def walk(cls: type[errors.VmctlError]) -> None:
        for sub in cls.__subclasses__():
            ref = sub.reference
            assert re.fullmatch(r"[a-z]+(-[a-z]+)*", ref), ref
            assert ref not in seen, f"{ref} used by {seen.get(ref)} and {sub}"
            seen[ref] = sub
            walk(sub)

    walk(errors.VmctlError)
    assert len(seen) > 10


def test_virtual_clock() -> None:
    c = VirtualClock(5)
    c.sleep(2)
    assert c.now() == 7
    with pytest.raises(ValueError):
        c.set(1)
    with pytest.raises(ValueError):
        ScaledClock(0)


def test_yaml_errors_name_location(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="does not exist"):
        load_yaml(tmp_path / "nope.yaml")
    with pytest.raises(errors.ConfigError, match="line 3"):
        parse_yaml("a: 1\nb: [\n", "f.yaml")
    with pytest.raises(errors.ConfigError, match="top level: must be a mapping"):
        parse_yaml("- 1\n", "f.yaml")


def test_section_reader() -> None:
    s = Section({"a": 3, "b": "x", "sub": {"c": 1.5}, "typo": 1}, "f.yaml")
    assert s.integer("a", lo=0) == 3
    assert s.choice("b", ("x", "y")) == "x"
    assert s.section("sub").number("c") == 1.5
    with pytest.raises(errors.ConfigError, match=r"f\.yaml: typo: unknown key"):
        s.finish()
    with pytest.raises(errors.ConfigError, match="a: must be <= 2"):
        Section({"a": 3}, "f.yaml").integer("a", hi=2)
    with pytest.raises(errors.ConfigError, match=r"sub\.c: must be int"):
        Section({"sub": {"c": "z"}}, "f.yaml").section("sub").integer("c")


def test_unknown_policy() -> None:
    with pytest.raises(errors.UnknownPolicyError, match="nonesuch"):
        create_policy("nonesuch")


def test_a_policy_lookup_imports_only_the_modules_up_to_its_own() -> None:
    """``create_policy("easy")`` must not import the vcsched MILP (scipy.optimize, 0.15 s); listing the
    policies imports every module. A fresh interpreter, so that other tests' imports do not count."""
    import subprocess
    import sys

    code = ("import sys; from vmctl.policies.registry import available_policies, create_policy; "
            "create_policy('easy'); print('vmctl.policies.vcsched.policy' in sys.modules); "
            "n = len(available_policies()); print('vmctl.policies.vcsched.policy' in sys.modules, n > 20)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "True"]


def test_cli_error_mapping() -> None:
    from vmctl.errors import exit_code_for

    assert exit_code_for(errors.TraceFormatError(path="a", line=1, problem="p")) == 2
    assert exit_code_for(errors.NotFound(kind="job", name="x")) == 3
    assert exit_code_for(errors.Forbidden(principal="p", action="a")) == 5
    assert exit_code_for(errors.DaemonUnavailable(url="u", problem="p")) == 6
