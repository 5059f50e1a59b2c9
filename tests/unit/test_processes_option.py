"""``mq --processes``: a count or ``auto``, checked before anything starts (docs/api.md "Several mq processes")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from daemons._processes import parse_processes, usable_cpus
from daemons._settings import MAX_PROCESSES, Settings
from mqcore.errors import ConfigError
from tests.conftest import REPO


def test_auto_is_one_process_per_usable_cpu() -> None:
    assert parse_processes("auto") == parse_processes(" AUTO ") == min(len(os.sched_getaffinity(0)), MAX_PROCESSES)
    assert usable_cpus() >= 1
    assert parse_processes("3") == parse_processes(3) == 3


@pytest.mark.parametrize("value", [0, -1, MAX_PROCESSES + 1])
def test_a_count_out_of_range_is_a_config_error(value: int) -> None:
    with pytest.raises(ConfigError, match="processes must be 1-256 or auto"):
        Settings(processes=value)


@pytest.mark.parametrize(
    ("args", "env", "code"),
    [(["--processes", "two"], {}, 64), ([], {"MQ_PROCESSES": "0"}, 78), ([], {"MQ_PROCESSES": "many"}, 78)],
)
def test_a_bad_value_exits_before_anything_starts(args: list[str], env: dict[str, str], code: int, tmp_path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MQ_")} | env
    proc = subprocess.run(
        [sys.executable, "-m", "daemons.front", "--root", str(tmp_path / "root"), "--port", "0", *args],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    assert "processes" in proc.stderr
