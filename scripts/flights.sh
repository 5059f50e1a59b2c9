#!/usr/bin/env bash
# The worked Spark pipeline (docs/examples.md): install mq with the spark and examples extras into
# ./.venv and run examples/flights (it starts its own mq stack on a temporary root).
# Usage: bash scripts/flights.sh [--limit N] [other options of python -m examples.flights]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[spark,examples]'
exec .venv/bin/python -m examples.flights "$@"
