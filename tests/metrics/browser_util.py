"""A real headless Chromium (Debian's) driven by Playwright, and a dashboard served to it.

`.ci/run` installs the `chromium` package when it is missing; elsewhere the browser tests
skip without a browser (and fail under CI, so a missing browser is never a silent pass).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def chromium_path() -> str | None:
    for cand in (
        os.environ.get("CHUTE_CHROMIUM"),
        "/usr/lib/chromium/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A launched headless browser (skips, or fails under CI, without one)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    path = chromium_path()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium: .ci/run should have installed Debian's chromium package")
        pytest.skip("no chromium browser (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def dashboard(root: os.PathLike[str] | str) -> Iterator[str]:
    """`chute metrics serve ROOT` on a free port, in a child process; yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "chute.metrics", "serve", str(root), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield match.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def open_page(
    browser: Any, url: str, *, width: int = 1400, height: int = 1010, **context: Any
) -> Iterator[Any]:
    """``url`` in a page of a fresh browser context; a script error on it fails the test."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, **context)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    try:
        yield page
    finally:
        ctx.close()
    assert not errors, errors
