#!/usr/bin/env bash
# Sets up everything vmctl needs on a fresh Debian machine: system packages (apt-get) and a Python
# virtual environment in .venv with vmctl installed in editable mode plus test tools and libvirt-python.
# Idempotent and quick when nothing changed (a stamp keyed on pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.vmctl-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -e ".[dev,libvirt]"
  echo "$want" > "$stamp"
fi
echo "setup: ok ($(.venv/bin/python --version))"
