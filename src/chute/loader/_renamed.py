"""loaderx's names for DataLoader arguments, mapped to chute's with a DeprecationWarning."""

from __future__ import annotations

from typing import Any

from chute._util.renamed import move_renamed, unknown_keyword
from chute.loader._sampler import mode_from_code

#: loaderx 0.7.3 name -> chute name.
RENAMED = {"num_workers": "num_threads", "prefetch_size": "prefetch", "mode": "sampler"}


def translate(renamed: dict[str, Any], given: dict[str, Any], valid: list[str]) -> dict[str, Any]:
    """Chute's arguments for the loaderx-named ones in ``renamed``.

    ``given`` holds the chute arguments the caller passed explicitly (not left at their
    defaults); naming the same setting both ways is an error naming both. ``valid`` are the
    keywords DataLoader takes, for the nearest name in an unknown keyword's error.
    """
    for old in renamed:
        if old not in RENAMED:
            raise unknown_keyword("DataLoader", old, [*valid, *RENAMED])
    out = {new: value for new, value in given.items() if value is not None}
    if "mode" in renamed and not isinstance(renamed["mode"], str):  # the code names the mode
        if "sampler" in out:
            raise TypeError("DataLoader() got both mode= (loaderx's name) and sampler=")
        out["sampler"] = mode_from_code(renamed.pop("mode"), "mode", stacklevel=5)
    moved = {**renamed, **out}
    move_renamed("DataLoader", RENAMED, moved, origin="loaderx's name", stacklevel=5)
    return moved
