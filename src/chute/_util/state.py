"""One state contract for everything resumable: ``state_dict()`` / ``load_state_dict()``.

A state is a small JSON object: its ``kind`` and ``version``, where the object stands (a
step, an epoch and positions ...), the configuration that fixes its stream of batches, and a
``fingerprint`` of that configuration. `check_state` is the one validator: it refuses a state
of another kind, version or configuration with a `StateMismatchError` naming each field that
differs, with its saved and current value.

Two layouts are written, so that the states chute saved before this module still load: the
configuration beside the position (``flat``, the loader's ``{"step": ..., "seed": ...}``) or
under ``"config"`` (the in-place dataset's). States without ``kind`` or ``fingerprint``
(written by earlier versions) are checked by their version and fields alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from chute.errors import StateMismatchError

__all__ = ["Resumable", "StateLayout", "check_state", "fingerprint", "make_state"]


@runtime_checkable
class Resumable(Protocol):
    """What every resumable chute object is: a JSON-able ``state_dict()``, and
    ``load_state_dict(state)`` continuing exactly there (or refusing a foreign state).

    >>> import numpy as np, chute
    >>> loader = chute.DataLoader({"x": np.arange(10)}, batch_size=2)
    >>> isinstance(loader, Resumable), isinstance(chute.Sampler(10, 2), Resumable)
    (True, True)
    >>> loader.close()
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def fingerprint(config: Mapping[str, Any]) -> str:
    """A short digest of a JSON-able configuration, the same for equal configurations
    whatever the order of their keys.

    >>> fingerprint({"seed": 1, "batch_size": 8}) == fingerprint({"batch_size": 8, "seed": 1})
    True
    >>> len(fingerprint({"seed": 1}))
    16
    """
    text = json.dumps(config, sort_keys=True)  # as the insitu manifest digest always was
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as it reads back from JSON (tuples become lists), refused if it is not
    JSON-able: a state is compared with what a checkpoint file gives back."""
    try:
        return dict(json.loads(json.dumps(dict(config), allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a state's configuration must be JSON-able: {exc}") from None


@dataclass(frozen=True)
class StateLayout:
    """The states of one kind of resumable object.

    ``versions`` is the version written, then older ones still read; ``position`` the keys
    every state holds beside the configuration; ``nested`` puts the configuration under
    ``"config"`` instead of beside the position; ``ours`` names the loading object's values
    in messages (``seed: saved 1, current 2``); ``note`` is added when a version is refused.

    >>> layout = StateLayout("Counter", (1,), ("step",))
    >>> make_state(layout, {"seed": 3}, step=5)
    {'version': 1, 'kind': 'Counter', 'step': 5, 'seed': 3, 'fingerprint': '...'}
    """

    kind: str
    versions: tuple[int, ...]
    position: tuple[str, ...]
    nested: bool = False
    ours: str = "current"
    note: str = ""


def make_state(layout: StateLayout, config: Mapping[str, Any], **position: Any) -> dict[str, Any]:
    """A state of ``layout``'s kind: where the object stands (``position``), its
    configuration and the configuration's fingerprint. JSON-able by construction.

    >>> layout = StateLayout("Reader", (2,), ("epoch",), nested=True)
    >>> state = make_state(layout, {"seed": 0}, epoch=1)
    >>> state["config"], state["epoch"]
    ({'seed': 0}, 1)
    """
    config = _json(config)
    state: dict[str, Any] = {"version": layout.versions[0], "kind": layout.kind, **position}
    if layout.nested:
        state["config"] = config
    else:
        state.update(config)
    state["fingerprint"] = fingerprint(config)
    return state


def _refuse(
    layout: StateLayout, why: str, differences: dict[str, tuple[Any, Any]] | None = None
) -> StateMismatchError:
    return StateMismatchError(f"not a chute {layout.kind} state: {why}", differences)


def check_state(
    state: object,
    layout: StateLayout,
    config: Mapping[str, Any],
    *,
    hint: Callable[[str, Any, Any], str] | None = None,
) -> Mapping[str, Any]:
    """``state`` once it is known to be a state of ``layout``'s kind and a version it reads,
    with ``layout.position``'s keys, saved under ``config`` (the loading object's
    configuration). Otherwise a `StateMismatchError` naming each differing field with its
    saved and current value; ``hint(field, saved, current)`` may add advice for a field.

    >>> layout = StateLayout("Counter", (1,), ("step",))
    >>> state = make_state(layout, {"seed": 3, "batch_size": 8}, step=5)
    >>> check_state(state, layout, {"seed": 3, "batch_size": 8})["step"]
    5
    >>> try:
    ...     check_state(state, layout, {"seed": 4, "batch_size": 8})
    ... except ValueError as e:
    ...     print(str(e).split(" (")[1])
    seed: saved 3, current 4)
    """
    if not isinstance(state, Mapping):
        raise _refuse(layout, f"a state is a dict (a state_dict()), got {type(state).__name__}")
    saved_kind = state.get("kind", layout.kind)  # states before kinds were written lack it
    if saved_kind != layout.kind:
        raise _refuse(
            layout,
            f"kind: saved {saved_kind!r}, {layout.ours} {layout.kind!r}",
            {"kind": (saved_kind, layout.kind)},
        )
    version = state.get("version")
    if isinstance(version, bool) or version not in layout.versions:
        reads = ", ".join(map(str, layout.versions))
        raise _refuse(
            layout,
            f"version: saved {version!r}, {layout.ours} {layout.versions[0]} (this chute reads "
            f"version {reads}){layout.note}",
            {"version": (version, layout.versions[0])},
        )
    missing = [key for key in layout.position if key not in state]
    if missing:
        raise _refuse(layout, f"it has no {', '.join(map(repr, missing))}")
    ours = _json(config)
    saved = state.get("config") if layout.nested else state
    saved = saved if isinstance(saved, Mapping) else {}
    differences = {k: (saved.get(k), v) for k, v in ours.items() if saved.get(k) != v}
    if not differences and state.get("fingerprint", fingerprint(ours)) != fingerprint(ours):
        differences["fingerprint"] = (state.get("fingerprint"), fingerprint(ours))
    if differences:
        detail = "; ".join(
            f"{k}: saved {s!r}, {layout.ours} {o!r}" for k, (s, o) in differences.items()
        )
        advice = [hint(k, s, o) for k, (s, o) in differences.items()] if hint else []
        raise StateMismatchError(
            f"the saved {layout.kind} state belongs to a different stream of batches: the "
            f"configuration that fixes the batch order differs ({detail})"
            + "".join(f"; {a}" for a in advice if a),
            differences,
        )
    return state
