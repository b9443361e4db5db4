#!/usr/bin/env bash
# Installs the Debian packages vmctl needs for the demo and the full test suite.
# Idempotent: skips apt entirely when every package is already installed.
set -euo pipefail
PKGS=(
  python3 python3-venv python3-dev gcc pkg-config make git
  libvirt-daemon-system libvirt-clients libvirt-dev qemu-system-x86 qemu-utils
  postgresql prometheus openssh-server openssh-client systemd iproute2 util-linux
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "system packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# --no-install-recommends keeps it small; policy-rc.d stops services from auto-starting in containers.
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
