"""The deployment walkthrough of docs/operations.md ("## systemd"), followed step by step.

Every command of the walkthrough's shell block must match exactly one step below, in order; a command
added to or changed in the docs without a step here fails the test, so the docs cannot drift. Each
step runs the real command (``vmctl config check``, ``curl``, ``openssl req``, ``vmctl token|cert|
node|job``) with the walkthrough's paths moved under a temporary directory, on copies of the configs
in ``etc/``; ``systemctl enable --now`` becomes starting the service's command line as its unit does.
Steps that need root on a real host (``useradd``, ``systemctl daemon-reload``, ``pip install``,
``ln`` into ``/usr/local/bin``) check what they rely on instead (the console scripts, the unit and doc
files they name).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from vmctl.localcluster import ManagedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def walkthrough_commands() -> list[str]:
    """The commands of the first ``sh`` block after "Install, from the clone": continuation lines
    joined, comments and blank lines dropped."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("Install, from the clone")
    block = text[text.index("```sh\n", start) + 6:]
    block = block[: block.index("```")]
    commands: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if raw.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line.strip()).strip()
        pending = ""
        if line:
            commands.append(line)
    return commands


@dataclass
class Host:
    """The walkthrough's machine, under ``tmp``: paths, environment, running services."""

    tmp: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    procs: list[ManagedProcess] = field(default_factory=list)

    def path(self, p: str) -> Path:
        return Path(self.moved(p))

    def moved(self, text: str) -> str:
        """The walkthrough's absolute paths and URL, moved under ``tmp`` and onto the free port."""
        t = str(self.tmp)
        text = text.replace("https://vmctld.example:8443", f"https://127.0.0.1:{self.port}")
        for prefix in ("/var/lib/vmctl-agent", "/var/lib/vmctl", "/etc/vmctl", "/root"):
            text = re.sub(rf"(?<![\w.]){re.escape(prefix)}(?=[/\s'\"]|$)", t + prefix, text)
        return text

    def confined(self, text: str) -> None:
        """Fail if ``text`` still names a real system path of the walkthrough (the test must never
        touch this machine's /var/lib/vmctl or /etc/vmctl)."""
        for prefix in ("/var/lib/vmctl", "/etc/vmctl", "/root/"):
            for m in re.finditer(re.escape(prefix), text):
                before = text[max(0, m.start() - len(str(self.tmp))):m.start()]
                assert before == str(self.tmp), f"{prefix} escaped the test directory in: {text}"

    def run(self, argv: list[str], ok: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.tmp / "root",
                             env={**os.environ, **self.env, "COLUMNS": "200"})
        if ok:
            assert res.returncode == 0, f"{' '.join(argv)} -> {res.returncode}\n{res.stdout}\n{res.stderr}"
        return res

    def vmctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run([str(BIN / "vmctl"), *args])

    def start(self, name: str, argv: list[str], ready: str | None) -> None:
        """Start a service's command line as its unit does; wait for its ready line on stdout, if it
        prints one (the agent logs its readiness; ``vmctl node list`` then shows it)."""
        proc = ManagedProcess(name, argv, self.tmp / f"{name}.log", env={**os.environ})
        self.procs.append(proc)
        proc.start()
        if ready is not None:
            proc.wait_line(ready, 90)


def _host_only(*needs: str) -> Callable[[Host, str], None]:
    """A step that needs root on a real host: check the files it relies on exist."""
    def step(h: Host, cmd: str) -> None:
        for n in needs:
            assert (ROOT / n).exists() or (BIN / n).exists(), f"{cmd!r} relies on {n}, which is missing"
    return step


def _install_daemon_config(h: Host, cmd: str) -> None:
    cfg = yaml.safe_load((ROOT / "etc" / "vmctld.yaml").read_text(encoding="utf-8"))
    moved = yaml.safe_load(h.moved(yaml.safe_dump(cfg)))
    moved["api"]["port"] = h.port
    h.confined(yaml.safe_dump(moved))
    out = h.path("/etc/vmctl/vmctld.yaml")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(moved), encoding="utf-8")
    h.path("/var/lib/vmctl").mkdir(parents=True, exist_ok=True)


def _check_and_enable(config: str, service: str) -> Callable[[Host, str], None]:
    def step(h: Host, cmd: str) -> None:
        h.vmctl("config", "check", str(h.path(config)))
        if service == "vmctld":
            h.start("vmctld", [str(BIN / "vmctld"), "--config", str(h.path(config))], "vmctld ready")
        else:
            h.start("vmctl-agent", [str(BIN / "vmctl-agent"), "--config", str(h.path(config))], None)
    return step


def _copy_ca(h: Host, cmd: str) -> None:
    state = h.path("/var/lib/vmctl")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700, "the state directory must be 0700"
    shutil.copy(state / "ca.pem", h.path("/etc/vmctl/ca.pem"))
    assert "PRIVATE" not in h.path("/etc/vmctl/ca.pem").read_text()


def _export(h: Host, cmd: str) -> None:
    h.env.update({"VMCTL_URL": f"https://127.0.0.1:{h.port}", "VMCTL_CA": str(h.path("/etc/vmctl/ca.pem")),
                  "VMCTL_TOKEN": h.path("/var/lib/vmctl/admin.token").read_text().strip()})


def _curl(h: Host, cmd: str) -> None:
    res = h.run(["curl", "-fsS", "--cacert", str(h.path("/etc/vmctl/ca.pem")), f"{h.env['VMCTL_URL']}/healthz"])
    assert json.loads(res.stdout) == {"status": "ok", "leader": True}


def _token(h: Host, cmd: str) -> None:
    res = h.vmctl("token", "issue", "--name", "alice", "--role", "read")
    assert "vmctl_" in res.stdout


def _pki_dir(h: Host, cmd: str) -> None:
    h.path("/etc/vmctl/pki").mkdir(parents=True, exist_ok=True)
    os.chmod(h.path("/etc/vmctl/pki"), 0o750)


def _openssl(h: Host, cmd: str) -> None:
    inner = re.search(r"\(umask 077; (openssl .*)\)$", cmd)
    assert inner is not None, cmd
    argv = h.moved(inner.group(1)).split()
    h.confined(" ".join(argv))
    old = os.umask(0o077)
    try:
        h.run(argv)
    finally:
        os.umask(old)
    key = h.path("/etc/vmctl/pki/node1.key")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and "PRIVATE KEY" in key.read_text()


def _chown(h: Host, cmd: str) -> None:
    assert stat.S_IMODE(h.path("/etc/vmctl/pki/node1.key").stat().st_mode) == 0o600


def _cert_issue(h: Host, cmd: str) -> None:
    # "copy node1.csr over": commands run in /root (moved), where openssl wrote it on this one machine
    assert (h.tmp / "root" / "node1.csr").is_file()
    h.vmctl("cert", "issue", "node1", "--csr", "node1.csr", "--out-dir", str(h.path("/root/pki-node1")))
    files = sorted(p.name for p in h.path("/root/pki-node1").iterdir())
    assert files == ["ca.crt", "node1.crt"], files  # no key: it never left node1


def _install_certs(h: Host, cmd: str) -> None:
    for name in ("node1.crt", "ca.crt"):
        shutil.copy(h.path("/root/pki-node1") / name, h.path("/etc/vmctl/pki") / name)


def _install_agent_config(h: Host, cmd: str) -> None:
    cfg = yaml.safe_load((ROOT / "etc" / "vmctl-agent.yaml").read_text(encoding="utf-8"))
    assert cfg["node"] == "node1" and cfg["backend"]["kind"] == "mock"
    # the daemon section as the file's own comment block describes it
    cfg["daemon"] = {"url": "https://vmctld.example:8443", "cert_file": "/etc/vmctl/pki/node1.crt",
                     "key_file": "/etc/vmctl/pki/node1.key", "ca_file": "/etc/vmctl/pki/ca.crt"}
    moved = yaml.safe_load(h.moved(yaml.safe_dump(cfg)))
    h.confined(yaml.safe_dump(moved))
    h.path("/etc/vmctl/agent.yaml").write_text(yaml.safe_dump(moved), encoding="utf-8")


def _node_list(h: Host, cmd: str) -> None:
    deadline = time.monotonic() + 90
    while True:
        res = h.vmctl("node", "list", "-o", "json")
        nodes = json.loads(res.stdout)["nodes"]
        ready = [n for n in nodes if n["name"] == "node1" and n["state"] == "ready"
                 and n["generation_applied"] == n["generation"] and n["report_age_s"] is not None]
        if ready:
            break
        assert time.monotonic() < deadline, f"node1 not ready and applied: {nodes}"
        time.sleep(1)
    assert "node1" in h.vmctl("node", "list").stdout


def _first_job(h: Host, cmd: str) -> None:
    """``vmctl job submit ... --name NAME``: submitted, and it ends ``done``."""
    args = cmd.split()[1:]
    assert args[:2] == ["job", "submit"], cmd
    name = args[args.index("--name") + 1]
    h.vmctl(*args)
    deadline = time.monotonic() + 120
    while True:
        jobs = json.loads(h.vmctl("job", "list", "-o", "json").stdout)["jobs"]
        first = [j for j in jobs if j["name"] == name]
        if first and first[0]["state"] == "done":
            break
        assert time.monotonic() < deadline, f"the job {name} did not finish: {first}"
        time.sleep(1)


def _policy_list(h: Host, cmd: str) -> None:
    assert "NEEDS" in h.vmctl("policy", "list").stdout
    needs = {p["name"]: p["needs"] for p in json.loads(h.vmctl("policy", "list", "-o", "json").stdout)["policies"]}
    assert needs["measy"]["layout"] == {"discipline": "priority", "levels": 2}
    assert needs["vcsched-mcb8"]["layout"] == {"discipline": "shared", "levels": 1}


#: the host layout each switch of the walkthrough lays node1 out in
SWITCHED = {"gs-m": ("timeslice", 3), "vcsched-mcb8": ("shared", 1), "dispatch-priority": ("shared", 2),
            "measy": ("priority", 2)}


def _switch(h: Host, cmd: str) -> None:
    """``vmctl policy set NAME ... --relayout``: it follows the switch to its end; node1 then carries the
    policy's layout (its agent re-laid the host out on vmctld's word, its config unchanged)."""
    args = cmd.split()[1:]
    res = h.vmctl(*args)
    name = args[2]
    assert f"switched to {name}" in res.stderr, res.stderr
    node = next(n for n in json.loads(h.vmctl("node", "list", "-o", "json").stdout)["nodes"] if n["name"] == "node1")
    assert (node["discipline"], node["levels"]) == SWITCHED[name], node


def _policy_show(h: Host, cmd: str) -> None:
    out = h.vmctl("policy", "show").stdout
    assert "policy   measy" in out and "2 priority levels per core (set by vmctld)" in out, out


#: (pattern the walkthrough's command must match, the step that follows it), in the walkthrough's order
STEPS: list[tuple[str, Callable[[Host, str], None]]] = [
    (r"cd /path/to/vmctl$", _host_only("pyproject.toml")),
    (r"python3 -m venv /opt/vmctl && /opt/vmctl/bin/pip install '\./\[libvirt\]'$", _host_only("pyproject.toml")),
    (r"ln -sf /opt/vmctl/bin/vmctld /opt/vmctl/bin/vmctl-agent /opt/vmctl/bin/vmctl /usr/local/bin/$",
     _host_only("vmctld", "vmctl-agent", "vmctl")),
    (r"install -D -m 0644 docs/\*\.md -t /usr/local/share/doc/vmctl/$", _host_only("docs/operations.md")),
    (r"install -m 0644 systemd/vmctl\.slice systemd/vmctld\.service systemd/vmctl-agent\.service /etc/systemd/system/$",
     _host_only("systemd/vmctl.slice", "systemd/vmctld.service", "systemd/vmctl-agent.service")),
    (r"useradd --system --home /var/lib/vmctl --shell /usr/sbin/nologin vmctl$", _host_only()),
    (r"install -D -m 0644 etc/vmctld\.yaml /etc/vmctl/vmctld\.yaml$", _install_daemon_config),
    (r"vmctl config check /etc/vmctl/vmctld\.yaml && systemctl daemon-reload && systemctl enable --now vmctld$",
     _check_and_enable("/etc/vmctl/vmctld.yaml", "vmctld")),
    (r"install -m 0644 /var/lib/vmctl/ca\.pem /etc/vmctl/ca\.pem$", _copy_ca),
    (r"export VMCTL_URL=https://vmctld\.example:8443 VMCTL_CA=/etc/vmctl/ca\.pem "
     r"VMCTL_TOKEN=\$\(cat /var/lib/vmctl/admin\.token\)$", _export),
    (r"curl -fsS --cacert /etc/vmctl/ca\.pem \$VMCTL_URL/healthz$", _curl),
    (r"vmctl token issue --name alice --role read$", _token),
    (r"useradd --system --home /var/lib/vmctl-agent --shell /usr/sbin/nologin -G libvirt vmctl-agent$",
     _host_only()),
    (r"install -d -m 0750 -g vmctl-agent /etc/vmctl/pki$", _pki_dir),
    (r"\(umask 077; openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
     r"-keyout /etc/vmctl/pki/node1\.key -out /root/node1\.csr -subj /CN=node:node1\)$", _openssl),
    (r"chown vmctl-agent /etc/vmctl/pki/node1\.key$", _chown),
    (r"vmctl cert issue node1 --csr node1\.csr --out-dir /root/pki-node1$", _cert_issue),
    (r"install -m 0644 node1\.crt ca\.crt /etc/vmctl/pki/$", _install_certs),
    (r"install -D -m 0644 etc/vmctl-agent\.yaml /etc/vmctl/agent\.yaml$", _install_agent_config),
    (r"vmctl config check /etc/vmctl/agent\.yaml && systemctl daemon-reload && systemctl enable --now vmctl-agent$",
     _check_and_enable("/etc/vmctl/agent.yaml", "vmctl-agent")),
    (r"vmctl node list$", _node_list),
    (r"vmctl job submit -n 2 -t 120 --work-seconds 5 --name first$", _first_job),
    (r"vmctl policy list$", _policy_list),
    (r"vmctl policy set gs-m -p mpl=3 -p slice=10 --relayout$", _switch),
    (r"vmctl job submit -n 2 -t 120 --work-seconds 5 --name gang$", _first_job),
    (r"vmctl policy set vcsched-mcb8 --relayout$", _switch),
    (r"vmctl job submit -n 2 -t 120 --work-seconds 5 --cpu-need 0\.5 --name shared$", _first_job),
    (r"vmctl policy set dispatch-priority --relayout$", _switch),
    (r"vmctl policy set measy --relayout$", _switch),
    (r"vmctl policy show$", _policy_show),
]


def test_every_walkthrough_command_has_a_step() -> None:
    commands = walkthrough_commands()
    assert len(commands) == len(STEPS), "\n".join(commands)
    for cmd, (pattern, _step) in zip(commands, STEPS, strict=True):
        assert re.match(pattern, cmd), f"the walkthrough says {cmd!r}; its step expects /{pattern}/"


def test_the_walkthrough_deploys_a_working_cluster(tmp_path: Path) -> None:
    for tool in ("curl", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: the walkthrough uses it")
    h = Host(tmp_path)
    (tmp_path / "root").mkdir()
    try:
        for cmd, (pattern, step) in zip(walkthrough_commands(), STEPS, strict=True):
            assert re.match(pattern, cmd), cmd
            step(h, cmd)
    finally:
        for p in reversed(h.procs):
            p.stop()
