"""loaderx's names for DataLoader arguments, mapped to chute's with a DeprecationWarning."""

from __future__ import annotations

import warnings
from typing import Any

from chute.loader._sampler import mode_from_code

#: loaderx 0.7.3 name -> chute name.
RENAMED = {"num_workers": "num_threads", "prefetch_size": "prefetch", "mode": "sampler"}


def translate(renamed: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Chute's arguments for the loaderx-named ones in ``renamed``.

    ``given`` holds the chute arguments the caller passed explicitly (not left at their
    defaults); naming the same setting both ways is an error naming both.
    """
    out: dict[str, Any] = {}
    for old, value in renamed.items():
        new = RENAMED.get(old)
        if new is None:
            raise TypeError(f"DataLoader() got an unexpected keyword argument {old!r}")
        if given.get(new) is not None:
            raise TypeError(f"DataLoader() got both {old}= (loaderx's name) and {new}=")
        if old == "mode" and not isinstance(value, str):  # the code names the mode
            out[new] = mode_from_code(value, "mode", stacklevel=4)
            continue
        out[new] = value
        warnings.warn(
            f"{old}= is loaderx's name; chute spells it {new}=", DeprecationWarning, stacklevel=3
        )
    return out
