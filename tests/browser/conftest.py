"""A real headless Chromium for the console test (../shared/notes/browser-testing.md).

Debian's ``chromium-headless-shell`` driven by a pinned Playwright with
``executable_path`` (never ``playwright install``, which downloads browsers).
scripts/test.sh installs the package when it is missing (as root). Without
Chromium or Playwright the browser tests are skipped locally and FAIL under
``CI=true``, like the ``faults`` and ``spark`` suites.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

#: Debian's headless shell (package chromium-headless-shell); the full browser as a fallback.
CHROMIUM_PATHS = ("/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chromium")


def browser_unavailable(reason: str) -> None:
    """Skip a browser test locally; fail it under CI=true, where the browser suite must run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser test cannot run under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the session (Playwright's sync API)."""
    executable = next((p for p in CHROMIUM_PATHS if os.access(p, os.X_OK)), None)
    if executable is None:
        browser_unavailable("Chromium is not installed (apt-get install chromium-headless-shell)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser_unavailable("playwright is not installed (the dev extra)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        try:
            yield browser
        finally:
            browser.close()
