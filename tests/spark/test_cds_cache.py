"""The cache of Spark's class-data-sharing archives (tests/spark/conftest.py) prunes archives unused for a week.

Real files in a temp folder standing in for ``~/.cache/mq/spark-cds``; their ages are set with ``os.utime``.
No Spark needed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.spark.conftest import CDS_KEEP_DAYS, prune_archives

DAY = 86400.0


def _file(folder: Path, name: str, age_days: float, now: float) -> Path:
    path = folder / name
    path.write_bytes(b"x")
    os.utime(path, (now - age_days * DAY, now - age_days * DAY))
    return path


def test_prune_marks_the_archive_in_use_and_deletes_only_stale_archives(tmp_path: Path) -> None:
    now = time.time()
    keep = _file(tmp_path, "spark-aaaa.jsa", CDS_KEEP_DAYS + 30, now)
    stale = _file(tmp_path, "spark-bbbb.jsa", CDS_KEEP_DAYS + 1, now)
    recent = _file(tmp_path, "spark-cccc.jsa", CDS_KEEP_DAYS - 1, now)
    stale_partial = _file(tmp_path, "spark-dddd.jsa.1234.tmp", CDS_KEEP_DAYS + 1, now)
    fresh_partial = _file(tmp_path, "spark-eeee.jsa.5678.tmp", 0, now)
    other = _file(tmp_path, "notes.txt", CDS_KEEP_DAYS + 30, now)

    removed = prune_archives(keep, now=now)

    assert sorted(removed) == sorted([stale, stale_partial])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (keep, recent, fresh_partial, other))
    assert abs(keep.stat().st_mtime - now) < 0.01, "the archive in use is marked used now"


def test_prune_with_no_archive_yet_and_no_folder_does_nothing(tmp_path: Path) -> None:
    assert prune_archives(tmp_path / "missing" / "spark-ffff.jsa") == []
    assert prune_archives(tmp_path / "spark-ffff.jsa") == []
    assert list(tmp_path.iterdir()) == []
