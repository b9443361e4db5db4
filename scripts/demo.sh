#!/usr/bin/env bash
# The main job. Sets everything up, then runs vmctl's demo (see README, "The main job").
# With --backend libvirt it also starts virtlogd and libvirtd when they are not running (as root; there
# is no systemd on these machines) and stops them again at the end, by pid: only what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ " $* " != *" --backend libvirt "* && " $* " != *" --backend=libvirt "* ]]; then
    exec .venv/bin/vmctl demo "$@"
fi

started=()
stop_started() {
    local pid i
    for ((i = ${#started[@]} - 1; i >= 0; i--)); do
        pid=${started[i]}
        kill -TERM "$pid" 2>/dev/null || continue
        # gone, or a zombie nobody reaps (a container's PID 1 may not)
        for _ in $(seq 100); do
            [[ -r /proc/$pid/stat && $(cut -d' ' -f3 "/proc/$pid/stat") != Z ]] || break
            sleep 0.1
        done
    done
}
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
kvm_restore=""
cleanup() {
    stop_started
    if [[ -n $kvm_restore ]]; then chgrp "${kvm_restore% *}" /dev/kvm; chmod "${kvm_restore#* }" /dev/kvm; fi
}
# QEMU runs as libvirt-qemu (group kvm); without udev /dev/kvm is root-only. Give the kvm group access as
# Debian's udev rule would, as the test suite does (restored at the end): libvirtd caches what QEMU can
# do per access mode, and a flip between the two makes it probe QEMU again (a minute or more on a busy
# machine, during which no VM can be defined)
if [[ $(id -u) == 0 && -c /dev/kvm ]] && getent group kvm >/dev/null; then
    mode=$(stat -c %a /dev/kvm)
    if [[ $(stat -c %G /dev/kvm) != kvm || $(( 8#$mode & 8#060 )) != $(( 8#060 )) ]]; then
        kvm_restore="$(stat -c %g /dev/kvm) $mode"
        trap cleanup EXIT
        chgrp kvm /dev/kvm && chmod g+rw /dev/kvm
    fi
fi
if [[ ! -S /run/libvirt/libvirt-sock ]]; then
    if [[ $(id -u) != 0 ]]; then
        echo "demo.sh: libvirtd is not running and starting it needs root" >&2
        exit 1
    fi
    trap cleanup EXIT
    for daemon in virtlogd libvirtd; do
        if ! alive "/run/$daemon.pid"; then
            "$daemon" -d
            for _ in $(seq 100); do alive "/run/$daemon.pid" && break; sleep 0.1; done
            alive "/run/$daemon.pid" || { echo "demo.sh: $daemon did not start" >&2; exit 1; }
            started+=("$(cat "/run/$daemon.pid")")
            echo "demo.sh: started $daemon (pid ${started[-1]}); it is stopped at the end"
        fi
    done
    for _ in $(seq 100); do [[ -S /run/libvirt/libvirt-sock ]] && break; sleep 0.1; done
fi
# in the foreground: Ctrl-C reaches the demo (it removes its domains and stops its processes), then
# the EXIT trap stops the daemons this script started
.venv/bin/vmctl demo "$@"
