#!/usr/bin/env bash
# The main job. Sets everything up, then runs vmctl's demo (see README, "The main job").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vmctl demo "$@"
