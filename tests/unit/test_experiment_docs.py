"""docs/experiments.md, "Into pandas": the commands and the three pandas lines of the doc, run as they are
written (the commands at a small size): the average response recomputed from the ``--jobs-out`` file is
the sweep's for the same run. The lines are read from the doc, so the doc cannot drift from what runs."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tests.livedaemon import run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "experiments.md"
MARKER = "<!-- pandas-lines: the test runs the lines of this block -->"
#: the doc's sizes -> a test's (the rest of each command as written)
SMALL = {"--jobs": "300", "--procs": "64"}


def _blocks() -> tuple[list[list[str]], str]:
    """The doc's commands (the ``sh`` block before the marker) and its pandas lines (the block after)."""
    text = DOC.read_text(encoding="utf-8")
    head, sep, tail = text.partition(MARKER)
    assert sep, f"{DOC} lost its marker {MARKER!r}"
    sh = re.findall(r"```sh\n(.*?)```", head, re.S)[-1]
    py = re.match(r"\s*```python\n(.*?)```", tail, re.S)
    assert py is not None, "the marker must stand right before the python block"
    commands = [shlex.split(c) for c in sh.replace("\\\n", " ").splitlines() if c.strip().startswith("vmctl ")]
    return commands, py.group(1)


def test_the_docs_pandas_lines_recompute_the_sweeps_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import pandas  # noqa: F401  (a dependency of vmctl: the doc's lines need it, so does this test)

    commands, lines = _blocks()
    code_lines = [ln for ln in lines.splitlines() if ln.strip() and not ln.startswith("import ")]
    assert len(code_lines) == 3, code_lines
    monkeypatch.chdir(tmp_path)
    assert [c[:3] for c in commands] == [["vmctl", "sim", "sweep"], ["vmctl", "sim", "run"]]
    for argv in commands:
        args = [SMALL.get(argv[i - 1], a) for i, a in enumerate(argv)][1:]
        if args[1] == "sweep":
            args += ["--workers", "1", "--no-plots"]
        code, _out, err = run_cli(capsys, *args)
        assert code == 0, (args, err)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(lines, str(DOC), "exec"), {})  # the doc's lines as they are written
    ours, sweeps = (float(x) for x in out.getvalue().split())
    assert ours == pytest.approx(sweeps, rel=1e-9) and ours > 0
