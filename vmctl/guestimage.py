"""A small Linux guest that runs job processes over SSH: kernel + initramfs built from Debian packages.

``python -m vmctl.guestimage build DIR`` writes, into ``DIR``:

* ``vmlinuz``: the kernel of Debian's ``linux-image-cloud-amd64`` (the package it depends on, fetched
  with ``apt-get download`` and unpacked with ``dpkg -x``; nothing is installed on the host);
* ``initrd.gz``: a gzip'd newc cpio archive holding ``busybox-static`` (the shell and every tool
  ``agents/remote.py`` uses: ``sh``, ``kill``, ``cut``, ``cat``, ``mkdir``, ``printf``), ``dropbear``
  (the SSH server, with the shared libraries it links, taken from ``dropbear-bin``, ``libtomcrypt1``,
  ``libtommath1`` and the host's own Debian libc/zlib/libcrypt), the virtio network modules of the
  kernel and their dependencies, and busybox ``init`` with the script below;
* ``id_ed25519`` (+ ``.pub``): the key the agent logs in with, authorised for ``root`` in the guest;
* ``host_key.pub``: the guest's SSH host key (generated at build time with ``dropbearkey``; every guest
  booted from this image has it), for the agent's ``known_hosts`` (``vmctl.localcluster.ssh_guest_config``
  writes one for a range of forwarded ports);
* ``manifest.json``: the build's inputs (package versions), its cache key, sizes and build time.

Cache: the key is a hash of the package names and versions apt would fetch, the init script and
``BUILDER_VERSION``; a ``DIR`` whose manifest has the same key is reused as it is (a rebuild is only
needed when Debian publishes a new kernel or busybox, or the script changes). Nothing binary is kept in
the repository; the archive is deterministic apart from the keys.

The guest: the kernel command line carries ``vmctl.hostname=NAME`` (the backend puts the VM's name
there), the init script mounts ``/proc``, ``/sys``, ``/dev``, ``/dev/pts`` and a tmpfs on ``/tmp``,
loads the modules, sets the hostname, configures ``eth0`` for QEMU user networking (10.0.2.15/24,
gateway 10.0.2.2) and busybox init keeps ``dropbear`` running on port 22 (key logins only). Busybox
init is PID 1, so orphaned job processes are reaped. The backend reaches the guest through a host
forward of QEMU's user network on a loopback port (the libvirt backend's ``xml.py``: ``SshForward``).

An operator's tool and the testbeds' (``vmctl demo --backend libvirt``, the live task-bag testbed,
``bench/guest_ssh.py``): it builds files, it does not touch libvirt, so it is no part of the backend.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vmctl.errors import GuestImageError, VmctlError

BUILDER_VERSION = 1
KERNEL_META = "linux-image-cloud-amd64"
PACKAGES = ("busybox-static", "dropbear-bin", "libtomcrypt1", "libtommath1")
#: the kernel modules the guest loads (with their dependencies, resolved from each module's .modinfo)
MODULES = ("virtio_pci", "virtio_net")
GUEST_ADDRESS = "10.0.2.15/24"  # QEMU user networking's defaults
GUEST_GATEWAY = "10.0.2.2"
MANIFEST = "manifest.json"

INIT_SCRIPT = f"""#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /run /var/log
while read -r m; do insmod "/lib/modules/$m.ko" || echo "vmctl-guest: insmod $m failed"; done < /etc/modules
name=$(sed -n 's/.*vmctl\\.hostname=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
hostname "${{name:-vmctl-guest}}"
ip link set lo up
ip link set eth0 up && ip addr add {GUEST_ADDRESS} dev eth0 && ip route add default via {GUEST_GATEWAY}
echo "vmctl-guest: $(hostname) up after $(cut -d' ' -f1 /proc/uptime) s"
"""

INITTAB = """::sysinit:/etc/rc
::respawn:/usr/sbin/dropbear -F -E -s -p 22 -r /etc/dropbear/host_key
::shutdown:/bin/umount -a -r
"""


@dataclass(frozen=True, slots=True)
class GuestImage:
    """The files of a built guest (all in one folder)."""

    dir: Path

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.gz"

    @property
    def key_file(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def host_key(self) -> str:
        """The guest's host public key, ``TYPE BASE64``."""
        return (self.dir / "host_key.pub").read_text(encoding="utf-8").strip()

    def manifest(self) -> dict[str, object]:
        doc: dict[str, object] = json.loads((self.dir / MANIFEST).read_text(encoding="utf-8"))
        return doc


# ---------------------------------------------------------------------------------------------- apt

def _error(step: str, problem: str) -> GuestImageError:
    return GuestImageError(step=step, problem=problem)


def _run(step: str, argv: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        res = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _error(step, f"{' '.join(argv)}: {exc}") from exc
    if res.returncode != 0:
        raise _error(step, f"{' '.join(argv)} exited {res.returncode}: {(res.stderr or res.stdout)[-500:]}")
    return res.stdout


def kernel_package() -> str:
    """The versioned kernel package ``linux-image-cloud-amd64`` depends on now."""
    out = _run("resolve the kernel", ["apt-cache", "depends", KERNEL_META])
    m = re.search(r"Depends:\s*(linux-image-\S+)", out)
    if m is None:
        raise _error("resolve the kernel", f"apt-cache depends {KERNEL_META} names no linux-image package "
                                                    "(run apt-get update?)")
    return m.group(1)


def candidate_version(package: str) -> str:
    out = _run(f"version of {package}", ["apt-cache", "policy", package])
    m = re.search(r"Candidate:\s*(\S+)", out)
    if m is None or m.group(1) == "(none)":
        raise _error(f"version of {package}", "apt knows no candidate version (run apt-get update?)")
    return m.group(1)


def inputs() -> dict[str, object]:
    """What the build depends on: package versions, the scripts and the builder's version. When apt
    knows none of the packages yet (no ``apt-get update`` on this machine) it updates its lists once
    (as root) and asks again."""
    def ask() -> dict[str, object]:
        pkgs = (kernel_package(), *PACKAGES)
        return {"builder": BUILDER_VERSION, "packages": {p: candidate_version(p) for p in pkgs},
                "modules": list(MODULES), "init": INIT_SCRIPT, "inittab": INITTAB}

    try:
        return ask()
    except GuestImageError:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise
        _run("apt-get update", ["apt-get", "update", "-q"])
        return ask()


def cache_key(doc: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- cpio

class Cpio:
    """A newc ("070701") cpio archive, as the kernel unpacks an initramfs: entries in order, uid/gid 0,
    mtime 0 (deterministic)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 1
        self.names: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        name = name.lstrip("/")
        if name in self.names:
            return
        self.names.add(name)
        raw = name.encode() + b"\0"
        fields = (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(raw), 0)
        self.ino += 1
        self.buf.write(b"070701" + b"".join(b"%08x" % f for f in fields) + raw)
        self.buf.write(b"\0" * (-(110 + len(raw)) % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * (-len(data) % 4))

    def dir(self, name: str, perm: int = 0o755) -> None:
        parts = name.strip("/").split("/")
        for i in range(1, len(parts)):
            self._entry("/".join(parts[:i]), stat.S_IFDIR | 0o755)
        self._entry(name, stat.S_IFDIR | perm)

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self.dir(os.path.dirname(name.strip("/")) or ".")
        self._entry(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        self.dir(os.path.dirname(name.strip("/")) or ".")
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int, perm: int = 0o600) -> None:
        self._entry(name, stat.S_IFCHR | perm, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        data = self.buf.getvalue()
        return data + b"\0" * (-len(data) % 512)


# ---------------------------------------------------------------------------------------------- parts

def module_depends(ko: Path) -> list[str]:
    """The ``depends=`` of a kernel module's .modinfo section (names, ``_`` and ``-`` as given)."""
    m = re.search(rb"(?:^|\0)depends=([^\0]*)\0", ko.read_bytes())
    return [d for d in (m.group(1).decode().split(",") if m else []) if d]


def resolve_modules(root: Path, wanted: Sequence[str]) -> list[Path]:
    """Module files of ``wanted`` and their dependencies, dependencies first."""
    by_name: dict[str, Path] = {}
    for ko in root.rglob("*.ko"):
        by_name[ko.stem.replace("-", "_")] = ko
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        key = name.replace("-", "_")
        if key in seen:
            return
        seen.add(key)
        ko = by_name.get(key)
        if ko is None:
            raise _error("kernel modules", f"module {name} is not in the kernel package")
        for dep in module_depends(ko):
            visit(dep)
        order.append(ko)

    for w in wanted:
        visit(w)
    return order


def shared_libraries(binary: Path, extra_dirs: Sequence[Path]) -> list[Path]:
    """The shared libraries ``binary`` loads (``ldd``, the unpacked packages' folders searched first)."""
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(str(d) for d in extra_dirs))
    out = _run(f"libraries of {binary.name}", ["ldd", str(binary)], env=env)
    libs: list[Path] = []
    for line in out.splitlines():
        if "not found" in line:
            raise _error(f"libraries of {binary.name}", line.strip())
        m = re.search(r"(/\S+)\s+\(0x", line)
        if m:
            libs.append(Path(m.group(1)))
    return libs


def _client_key(dst: Path) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    dst.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                      serialization.NoEncryption()))
    dst.chmod(0o600)
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    dst.with_suffix(".pub").write_text(pub + " vmctl-agent\n", encoding="utf-8")
    return pub


def build(out: Path, force: bool = False, log: object = print) -> GuestImage:
    """Build the guest into ``out`` (or reuse it when its manifest has the same cache key). The initramfs
    holds the guest's SSH host key and the agent key's authorization, so it is readable by its owner only
    (a build of an older version left it 0644: fixed on reuse too); libvirt hands kernel and initrd to the
    QEMU user while the VM runs (its DAC driver's dynamic ownership)."""
    img = _build(out, force, log)
    for path in (img.initrd, img.key_file):
        path.chmod(0o600)
    return img


def _build(out: Path, force: bool, log: object) -> GuestImage:
    say = log if callable(log) else (lambda _m: None)
    img = GuestImage(out)
    old: dict[str, object] = {}
    if not force and (out / MANIFEST).is_file():
        try:
            old = img.manifest()
        except (OSError, ValueError):
            old = {}
    complete = bool(old) and all(p.is_file() for p in (img.kernel, img.initrd, img.key_file))
    try:
        doc = inputs()
    except GuestImageError as exc:
        if not complete:
            raise
        say(f"guest image {out}: the package versions cannot be read ({exc}); using the build there "
            f"(key {old.get('key')})")
        return img
    key = cache_key(doc)
    if complete and old.get("key") == key:
        say(f"guest image {out}: cached (key {key})")
        return img
    for tool in ("apt-get", "dpkg", "ldd"):
        if shutil.which(tool) is None:
            raise _error("tools", f"{tool} is not on PATH (a Debian host is needed)")
    t0 = time.monotonic()
    packages = doc["packages"]
    assert isinstance(packages, dict)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vmctl-guest-") as tmp_s:
        tmp = Path(tmp_s)
        debs, root = tmp / "debs", tmp / "root"
        debs.mkdir()
        os.chmod(debs, 0o777)  # apt's _apt user writes the download here
        _run("apt-get download", ["apt-get", "download", "-q", *(f"{p}={v}" for p, v in packages.items())], cwd=debs)
        for deb in sorted(debs.glob("*.deb")):
            _run(f"unpack {deb.name}", ["dpkg", "-x", str(deb), str(root)])
        kernels = sorted((root / "boot").glob("vmlinuz-*"))
        if len(kernels) != 1:
            raise _error("kernel", f"expected one vmlinuz in the kernel package, found {len(kernels)}")
        release = kernels[0].name.removeprefix("vmlinuz-")
        lib_dirs = [root / "usr/lib/x86_64-linux-gnu", root / "lib/x86_64-linux-gnu"]
        dropbear = root / "usr/sbin/dropbear"
        env = dict(os.environ, LD_LIBRARY_PATH=":".join(str(d) for d in lib_dirs))
        hostkey = tmp / "host_key"
        _run("host key", [str(root / "usr/bin/dropbearkey"), "-t", "ed25519", "-f", str(hostkey)], env=env)
        pub = _run("host key", [str(root / "usr/bin/dropbearkey"), "-y", "-f", str(hostkey)], env=env)
        m = re.search(r"^(ssh-ed25519 \S+)", pub, re.M)
        if m is None:
            raise _error("host key", f"dropbearkey -y printed no ssh-ed25519 key: {pub[:200]}")
        client_pub = _client_key(tmp / "id_ed25519")

        cpio = Cpio()
        for d in ("dev", "proc", "sys", "tmp", "run", "etc/dropbear", "usr/sbin", "usr/bin", "sbin", "bin", "var"):
            cpio.dir(d)
        cpio.chardev("dev/console", 5, 1)
        cpio.chardev("dev/null", 1, 3, 0o666)
        cpio.file("bin/busybox", (root / "bin/busybox").read_bytes(), 0o755)
        applets = _run("busybox applets", [str(root / "bin/busybox"), "--list-full"]).split()
        for applet in applets:
            cpio.symlink(applet, "/bin/busybox")
        cpio.symlink("init", "/bin/busybox")
        cpio.file("usr/sbin/dropbear", dropbear.read_bytes(), 0o755)
        for lib in shared_libraries(dropbear, lib_dirs):
            real = lib.resolve()
            inside = str(lib)
            if str(lib).startswith(str(root)):
                inside = "/" + str(lib.relative_to(root))
            cpio.file(inside, real.read_bytes(), 0o755)
        mods = resolve_modules(root / "lib/modules" / release, MODULES)
        for ko in mods:
            cpio.file(f"lib/modules/{ko.stem}.ko", ko.read_bytes())
        cpio.file("etc/modules", "".join(f"{ko.stem}\n" for ko in mods).encode())
        cpio.file("etc/rc", INIT_SCRIPT.encode(), 0o755)
        cpio.file("etc/inittab", INITTAB.encode())
        cpio.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        cpio.file("etc/group", b"root:x:0:\n")
        cpio.file("etc/shadow", b"root:*:19000:0:99999:7:::\n", 0o600)
        cpio.file("etc/shells", b"/bin/sh\n")
        cpio.dir("root", 0o700)
        cpio.dir("root/.ssh", 0o700)
        cpio.file("root/.ssh/authorized_keys", (client_pub + " vmctl-agent\n").encode(), 0o600)
        cpio.file("etc/dropbear/host_key", hostkey.read_bytes(), 0o600)
        archive = gzip.compress(cpio.finish(), compresslevel=9, mtime=0)

        # publish: files first, manifest last (its key marks a complete build)
        (out / MANIFEST).unlink(missing_ok=True)
        shutil.copyfile(kernels[0], img.kernel)
        img.initrd.write_bytes(archive)
        shutil.copyfile(tmp / "id_ed25519", img.key_file)
        img.key_file.chmod(0o600)
        shutil.copyfile(tmp / "id_ed25519.pub", out / "id_ed25519.pub")
        (out / "host_key.pub").write_text(m.group(1) + "\n", encoding="utf-8")
        img.kernel.chmod(0o644)  # no secret in the kernel; the initrd is made private by ``build``
        out.chmod(0o755)
        seconds = time.monotonic() - t0
        manifest = {**doc, "key": key, "kernel_release": release, "modules_loaded": [ko.stem for ko in mods],
                    "kernel_bytes": img.kernel.stat().st_size, "initrd_bytes": img.initrd.stat().st_size,
                    "build_seconds": round(seconds, 2)}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    say(f"guest image {out}: built in {seconds:.1f} s (kernel {img.kernel.stat().st_size / 1e6:.1f} MB, "
        f"initrd {img.initrd.stat().st_size / 1e6:.1f} MB, key {key})")
    return img


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vmctl.guestimage",
                                 description="Build the SSH guest (kernel + initramfs) from Debian packages.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build into DIR (reused when its inputs did not change)")
    b.add_argument("dir", type=Path)
    b.add_argument("--force", action="store_true", help="rebuild even when DIR holds a build of the same inputs")
    a = ap.parse_args(argv)
    try:
        build(a.dir.resolve(), force=a.force)
    except VmctlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
