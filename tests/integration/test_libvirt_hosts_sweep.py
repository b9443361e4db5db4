"""The real-libvirt tests' helpers undo what a killed test process left behind (``sweep_stale``): the
machine partition's CPU share it raised, its guest images folder, its peer libvirtd's root. A run killed
with -9 left the partition at 262144 shares, and every later guest starved this host's own processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.libvirt_hosts import BOOST_RECORD, sweep_stale

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the helpers' state lives in /run and /var/lib (root)")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_runs_boost_is_undone_and_its_folders_removed(tmp_path: Path) -> None:
    dead = _dead_pid()
    knob = tmp_path / "cpu.shares"  # stands in for the machine partition's knob
    knob.write_text("262144")
    record = Path(BOOST_RECORD.format(pid=dead))
    images = Path(f"/var/lib/vmctl-it-{dead}")
    peer = Path(f"/run/vmctl-it-peer-{dead}")
    mine = Path(f"/var/lib/vmctl-it-{os.getpid()}")
    made_mine = not mine.exists()
    try:
        record.write_text(json.dumps({str(knob): "1024"}))
        images.mkdir()
        (images / "spin.img").write_bytes(b"x")
        (peer / "run").mkdir(parents=True)
        mine.mkdir(exist_ok=True)
        undone = sweep_stale()
        assert knob.read_text() == "1024"
        assert not record.exists() and not images.exists() and not peer.exists()
        assert mine.exists()  # a live process's (this one's) folder stays
        assert f"{knob} = 1024" in undone and str(images) in undone and str(peer) in undone
    finally:
        record.unlink(missing_ok=True)
        for d in (images, peer):
            subprocess.run(["rm", "-rf", str(d)], check=False)
        if made_mine:
            subprocess.run(["rm", "-rf", str(mine)], check=False)


def test_a_live_processs_record_is_left_alone(tmp_path: Path) -> None:
    knob = tmp_path / "cpu.shares"
    knob.write_text("262144")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    record = Path(BOOST_RECORD.format(pid=live.pid))
    try:
        record.write_text(json.dumps({str(knob): "1024"}))
        sweep_stale()
        assert knob.read_text() == "262144" and record.exists()
    finally:
        live.kill()
        live.wait()
        record.unlink(missing_ok=True)
