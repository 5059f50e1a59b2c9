#!/usr/bin/env bash
# Quick start: install mq into ./.venv and run mq, mq-mover and mq-reaper on one root.
# Usage: bash scripts/run.sh [--root DIR] [--port 8080] [--address 127.0.0.1]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
exec .venv/bin/mq-stack "$@"
