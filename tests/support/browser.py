"""Headless Chromium for the browser tests (tests/browser/, the quickstart's check): `browse` a page offline,
every host name resolving to nothing; `poppler` reads a printed PDF."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--hide-scrollbars",
]


def chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.fail("no Chromium: run scripts/install-chromium.sh (make test does)")


def browse(tmp_path, url: str, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=30000", *extra, url],
        capture_output=True,
        text=True,
        timeout=180,
    )


def poppler(tool: str, pdf) -> str:
    if not shutil.which(tool):
        pytest.fail(f"no {tool}: run scripts/install-chromium.sh (make test does), it installs poppler-utils")
    return subprocess.run([tool, str(pdf), *(["-"] if tool == "pdftotext" else [])], capture_output=True,
                          text=True, check=True, timeout=60).stdout  # fmt: skip
