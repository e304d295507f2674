"""Run a check in a forked child so a crash (a signal) or a hang fails the test cleanly."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable

OK, WRONG_DATA, UNEXPECTED = 0, 3, 4


def run_isolated(fn: Callable[[], int], timeout: float = 20.0) -> int:
    """Fork, run ``fn`` in the child, return its exit code, or -signal if it died of one.

    A child still running after ``timeout`` seconds is killed and reported as a hang.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        # The child runs only chute's own code, whose thread pool restarts after a fork.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        faulthandler.disable()  # a deliberate crash needs no dump of every thread
        faulthandler.dump_traceback_later(max(timeout - 1.0, 0.5))  # but a hang shows where
        code = UNEXPECTED
        try:
            code = fn()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the check hung for {timeout} s")
        time.sleep(0.002)
