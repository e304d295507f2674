"""Run a check in a freshly spawned interpreter, with a timeout: the isolation for checks
that make requests to object storage. A forked child cannot make them once its parent has
(obstore's runtime does not survive a fork), and every test process here has."""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from tests.store.isolate import UNEXPECTED


def _main(check: Callable[..., int], args: tuple[Any, ...]) -> None:
    code = UNEXPECTED
    try:
        code = check(*args)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_spawned(check: Callable[..., int], *args: Any, timeout: float = 60.0) -> int:
    """``check(*args)`` (a module-level function) in a spawned process: its return value as
    the exit code. A child still running after ``timeout`` seconds is killed: a hang."""
    proc = multiprocessing.get_context("spawn").Process(target=_main, args=(check, args))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise AssertionError(f"the check hung for {timeout} s")
    assert proc.exitcode is not None
    return proc.exitcode
