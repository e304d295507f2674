"""Doctests of src/chute: an example that needs an optional framework which this Python
lacks (torch has no CPU build for 3.12/3.13 here, TensorFlow lives in its own venv) is
skipped, saying which; any other failure stays a failure."""

from __future__ import annotations

import doctest
from collections.abc import Generator

import pytest
from _pytest.doctest import DoctestItem, MultipleDoctestFailures

OPTIONAL = ("torch", "jax", "tensorflow", "ray")


def _missing_optional(exc: BaseException) -> str | None:
    failures: list[object] = []
    if isinstance(exc, doctest.UnexpectedException):
        failures = [exc]
    elif isinstance(exc, MultipleDoctestFailures):
        failures = list(exc.failures)
    for failure in failures:
        if isinstance(failure, doctest.UnexpectedException):
            error = failure.exc_info[1]
            if isinstance(error, ModuleNotFoundError) and error.name in OPTIONAL:
                return error.name
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except Exception as exc:
        name = _missing_optional(exc) if isinstance(item, DoctestItem) else None
        if name is None:
            raise
        pytest.skip(f"this example needs {name}, which is not installed")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say, last and plainly, that the dashboard's browser tests did not run for want of a
    browser, and how to get one: a skip line among hundreds is easy to miss."""
    skipped = terminalreporter.stats.get("skipped", [])
    if any("no chromium" in str(getattr(r, "longrepr", "")) for r in skipped):
        terminalreporter.write_sep(
            "!",
            "the dashboard's browser tests were SKIPPED: no chromium on this machine; "
            "install Debian's with `apt-get install chromium` (as root; .ci/run does) "
            "or point CHUTE_CHROMIUM at a Chromium binary",
            yellow=True,
            bold=True,
        )
