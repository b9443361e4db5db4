#!/usr/bin/env bash
# The whole test suite: lint, strict type check, then pytest with warnings as errors.
# Real-hypervisor, PostgreSQL, sshd and systemd tests start what they need themselves.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export PATH="$PWD/.venv/bin:$PATH"
status=0
echo "== ruff"; ruff check . || status=1
echo "== mypy --strict"; mypy -p vmctl || status=1
echo "== pytest"; python -m pytest -W error "$@" || status=1
exit $status
