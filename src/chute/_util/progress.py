"""Progress bars for long store work: one unit (MiB), updated at least twice a second.

Python calls show a bar only for work over 256 MiB unless told otherwise; the command line
shows one unless ``-q``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from tqdm import tqdm

from chute._util.closing import Closing

MIB = 1 << 20
#: Work larger than this shows a bar in Python unless the caller says otherwise.
SHOW_OVER_BYTES = 256 << 20
#: Bytes handed to the store per step while a bar is shown: small enough for a bar that moves
#: at least once a second even at zstd level 19, large enough to keep every core busy.
STEP_BYTES = 4 << 20

_T = TypeVar("_T")
_SIZED = (
    "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} MiB "
    "[{elapsed}<{remaining}, {rate_fmt}]{postfix}"
)
_OPEN = "{desc}: {n:.1f} MiB [{elapsed}, {rate_fmt}]{postfix}"  # total not known yet


class Progress(Closing):
    """A bar counting bytes in MiB. ``show=None`` shows it once the work is large: at the
    start when ``total`` says so, else as soon as the bytes done pass the threshold.

    >>> with Progress(3 * MIB, "demo", show=False) as p:
    ...     p.advance(MIB)
    ...     p.reached(3 * MIB, 3 * MIB)
    """

    def __init__(self, total: int | None, desc: str, *, show: bool | None) -> None:
        self._desc, self._total, self._show, self._done = desc, total, show, 0
        self._bar: tqdm[None] | None = None
        if show or (show is None and (total or 0) > SHOW_OVER_BYTES):
            self._open()

    def _open(self) -> None:
        total = self._total
        self._bar = tqdm(
            total=None if total is None else total / MIB,
            initial=self._done / MIB,
            desc=self._desc,
            unit="MiB",
            bar_format=_OPEN if total is None else _SIZED,
            mininterval=0.5,
            file=sys.stderr,
            leave=True,
        )

    def _moved(self) -> None:
        if self._bar is None and self._show is None and self._done > SHOW_OVER_BYTES:
            self._open()
        elif self._bar is not None:
            if self._total is not None:
                self._bar.total = self._total / MIB
                self._bar.bar_format = _SIZED
            self._bar.update(self._done / MIB - self._bar.n)

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        self._moved()

    def reached(self, done: int, total: int) -> None:
        """Set the position (and the total, which may have become known) in bytes."""
        self._done, self._total = done, total
        self._moved()

    def callback(self) -> Callable[[int, int], None]:
        """``reached`` as the ``progress=`` callback of `RecordStore.verify` and `compact`."""
        return self.reached

    def while_running(self, what: str, work: Callable[[], _T]) -> _T:
        """Run ``work`` (one long native call, such as dictionary training) on a thread,
        ticking the bar's clock with ``what`` shown until it returns."""
        bar = self._bar
        if bar is None:
            return work()
        result: list[_T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                result.append(work())
            except BaseException as e:
                error.append(e)

        thread = threading.Thread(target=run, name="chute-progress-work")
        bar.set_postfix_str(what, refresh=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
            bar.refresh()
        bar.set_postfix_str("", refresh=True)
        if error:
            raise error[0]
        return result[0]

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
