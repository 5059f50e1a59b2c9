#!/usr/bin/env bash
# Quick start: install mq into ./.venv (only when the venv is missing or pyproject.toml changed; see
# scripts/venv.sh) and run mq, mq-mover and mq-reaper on one root.
# Usage: bash scripts/run.sh [--root DIR] [--port 8080] [--address 127.0.0.1]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh ""
exec "${MQ_VENV:-.venv}/bin/python" -m daemons.stack "$@"
