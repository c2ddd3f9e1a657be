"""Headless Chromium for the page tests: Debian's ``chromium`` package (``make browser`` installs
it), driven through its own command line (``--dump-dom``, ``--screenshot``, console messages on
stderr with ``--enable-logging=stderr``). Without it the tests skip with the reason, except where
``ATTNLAB_REQUIRE_BROWSER=1`` (CI) makes a missing browser a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

#: flags for a sandbox-less, offline, first-run-free headless browser (without the networking
#: ones it waits on the closed network)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
]


def chromium() -> str:
    """The browser's path, or skip (fail under ATTNLAB_REQUIRE_BROWSER=1)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    why = "headless Chromium is not installed (run `make browser`: apt-get install chromium)"
    if os.environ.get("ATTNLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(why)
    pytest.skip(why)


def run_browser(page: Path, *args: str, timeout: float = 120) -> tuple[str, list[str]]:
    """(stdout, the page's console lines) of one headless run on ``page``."""
    with tempfile.TemporaryDirectory() as profile:
        p = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    return p.stdout, console
