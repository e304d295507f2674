"""One benchmark run in a process of its own: the script reruns itself with ``--child`` and
a JSON spec, and prints its measurements as one ``RESULT {...}`` line."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def spawn(
    script: str, spec: dict[str, Any], env: dict[str, str] | None = None
) -> dict[str, float] | str:
    """The measurements of ``script --child SPEC``, or a line saying why there are none."""
    done = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    return f"failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:200]}"


def report(result: dict[str, Any]) -> None:
    """Print a child's measurements for `spawn`."""
    print("RESULT " + json.dumps(result), flush=True)
