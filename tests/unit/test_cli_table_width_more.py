"""The operator tables beyond jobs, nodes and VMs (events, operations, tokens, certificates) fit 100
columns a line per row without a terminal: short times, their free-text columns cut; ``-o wide`` prints
ISO times and cuts nothing (issue 25, item 4)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.livedaemon import run_cli

NOW = time.time()
LONG = ("requeued: node node-rack12-slot07 lost (its agent silent for 95 s; vmctld gave up on it) while "
        "migrating to node-rack14-slot02; the job's next run starts over")


class FakeClient:
    def events(self, since: float | None = None, after: int | None = None, limit: int | None = None,
               wait: float | None = None) -> dict[str, Any]:
        evs = [{"seq": i, "time": NOW - 600 + i, "kind": "job.requeued", "actor": "vmctld (policy measy)",
                "message": LONG} for i in range(3)]
        return {"events": evs, "last_seq": 2}

    def list_operations(self, job: str | None = None, state: str | None = None,
                        limit: int | None = None) -> list[dict[str, Any]]:
        return [{"id": f"op-{i}", "kind": "migrate", "job_id": "17", "state": "aborted", "origin": "policy measy",
                 "created": NOW - 60, "moves": [{"from": f"node-rack12-slot0{c}:{c}", "to": f"node-rack14-slot0{c}:{c}"}
                                                 for c in range(4)], "note": LONG} for i in range(3)]

    def list_tokens(self) -> list[dict[str, Any]]:
        return [{"id": f"t{i}", "name": "ci pipeline of the weather group, nightly ensemble runs " * 2,
                 "role": "operator", "created": NOW - 86400 * 40, "expires": NOW + 86400 * 400} for i in range(3)]

    def list_certs(self) -> list[dict[str, Any]]:
        return [{"serial": "0" + "ab" * 19 + "c", "node": "node-rack12-slot07.cluster.example.org",
                 "issued": NOW - 86400, "expires": NOW + 86400 * 365, "key_from": "agent (CSR, key never left it)",
                 "retired": NOW - 60}
                for _ in range(3)]


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClient()
    monkeypatch.setattr("vmctl.cli.events.ApiClient", lambda url, token, ca=None: fake)
    for mod in ("op", "token", "cert"):
        monkeypatch.setattr(f"vmctl.cli.{mod}._client", lambda url, token, ca: fake)


ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")
TABLES = [("events",), ("op", "list"), ("token", "list"), ("cert", "list")]


def _lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("argv", TABLES)
@pytest.mark.parametrize("columns", ["100", None])
def test_operator_tables_fit_100_columns(fake_api: None, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...],
                                         columns: str | None) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    lines = _lines(out)
    assert max(len(line.rstrip()) for line in lines) <= 100, out
    assert len(lines) == 3 + 2, out  # header, its rule, a line per row: nothing folded
    assert not ISO.search(out), out  # times short in the default table
    code, wide, err = run_cli(capsys, *argv, "-o", "wide")
    assert code == 0, err
    assert "\u2026" not in wide and len(_lines(wide)) == 3 + 2, wide
    assert ISO.search(wide), wide  # ISO 8601 under -o wide
    if argv == ("cert", "list"):
        assert ("0" + "ab" * 19 + "c").upper() in out  # the serial itself is never cut, its leading zero kept


def _gang_doc(cores: int, nodes: int = 2) -> dict[str, Any]:
    def row(r: int) -> dict[str, Any]:
        cells = {f"n{n}": [None if c >= cores - 3 else 10 * r + (c * 3) // cores for c in range(cores)]
                 for n in range(nodes)}
        return {"row": r, "active": r == 1, "cells": cells}

    return {"discipline": "timeslice", "levels": 3, "nodes": [f"n{n}" for n in range(nodes)],
            "rows": [row(r) for r in range(3)], "cells_per_row": nodes * cores, "rows_in_use": [0, 1, 2], "holes": 0}


def test_gang_show_fits_the_screen_and_wide_prints_every_core() -> None:
    from vmctl.cli.gang import gang_text

    small = gang_text(_gang_doc(4), 100)
    assert small.splitlines()[0].split() == ["NODE", "r0", "r1*", "r2"] and "x" not in small  # every core, as before
    big = _gang_doc(32)
    fitted = gang_text(big, 100).splitlines()
    assert max(map(len, fitted)) <= 100 and len(fitted) == 3, fitted  # runs: a line per node still
    assert fitted[1].split()[:5] == ["n0", "0x11", "1x11", "2x7", "-x3"], fitted  # job 0 on 11 cores, ...
    narrow = gang_text(big, 40).splitlines()
    assert max(map(len, narrow)) <= 40 and narrow[0] == "n0" and narrow[1].lstrip().startswith("r0 "), narrow
    wide = gang_text(big, None).splitlines()
    assert len(wide) == 3 and wide[1].split()[1:33] == [str(j) for j in big["rows"][0]["cells"]["n0"][:29]] + ["-"] * 3
