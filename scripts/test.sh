#!/usr/bin/env bash
# Install mq with its test dependencies into ./.venv, lint (ruff, import-linter's layer contracts), type-check
# (mypy --strict), and run
# the whole test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh '[dev,spark,examples]'   # installs only when .venv is missing or pyproject.toml changed
# Debian packages the tests need, installed when missing and running as root (e.g. CI) with one apt-get update and
# one install: curl (tests/docs/test_readme.py runs the README's curl examples), Debian's headless Chromium (the
# console's browser test, tests/browser), GlusterFS and faketime (tests/cluster and its clock-skew test). Without
# them those tests are skipped locally and fail under CI=true, saying what is missing.
packages=()
command -v curl > /dev/null || packages+=(curl ca-certificates)
[ -x /usr/lib/chromium/chromium-headless-shell ] || packages+=(chromium-headless-shell)
command -v glusterd > /dev/null && command -v glusterfs > /dev/null || packages+=(glusterfs-server glusterfs-client)
command -v faketime > /dev/null || packages+=(faketime)
if [ ${#packages[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "installing ${packages[*]} for the tests (apt-get)..." >&2
    { apt-get update -qq -o DPkg::Lock::Timeout=300 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
        "${packages[@]}"; } > /dev/null || echo "test.sh: could not install ${packages[*]}; the tests that need them will say why" >&2
fi
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache
# pytest rewrites the asserts of every test module and of its plugins' packages (schemathesis, hypothesis, anyio) in
# each worker: ~11 s of CPU per worker where PYTHONDONTWRITEBYTECODE=1 keeps it from caching them. One collection
# that may write that cache, on the core mypy leaves idle, lets every worker read it (docs/performance.md).
PYTHONDONTWRITEBYTECODE='' .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider > /dev/null 2>&1 &
warm=$!
# Spark's class-data-sharing archive (tests/spark/conftest.py, spark_java_options: every Spark JVM of the tests maps
# Spark's classes from it), made once per venv and cached in ~/.cache/mq/spark-cds. Made here, beside mypy, when it
# is missing: made inside the Spark tests' first set-up, under the whole suite's load, it took that set-up past its
# 240 s timeout (docs/performance.md, stop 29). Without Java or pyspark it does nothing; if it fails, the JVMs run
# without an archive.
.venv/bin/python -c 'from tests.spark.conftest import spark_jvm_options_here; spark_jvm_options_here()' > /dev/null 2>&1 &
cds=$!
# The type gate: mypy --strict over mqcore and daemons (config in pyproject.toml, [tool.mypy]).
.venv/bin/python -m mypy || { kill "$warm" "$cds" 2> /dev/null; exit 1; }
wait "$warm" || true  # a collection error shows again in the run itself
wait "$cds" || true
# The tests start a few hundred daemon and mqctl processes: compile the sources once, so that none of
# them compiles the same modules again (PYTHONDONTWRITEBYTECODE=1 environments never cache them).
.venv/bin/python -m compileall -q mqcore daemons
# In parallel workers (pytest-xdist): most tests wait on daemons, timeouts and subprocesses, not on a CPU.
# --dist loadgroup keeps each module, and each folder sharing one Spark cluster, GlusterFS volume or
# Chromium, in one worker (tests/conftest.py). MQ_TEST_WORKERS=0 runs everything in this process.
exec .venv/bin/python -m pytest -n "${MQ_TEST_WORKERS:-4}" --dist loadgroup "$@"
