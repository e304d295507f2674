"""Old spellings of public arguments, kept working for one release: a renamed keyword or an
argument now keyword-only still binds, with a `DeprecationWarning` naming the new spelling;
a misspelt keyword is a ``TypeError`` naming the nearest valid one.

>>> import warnings
>>> @legacy_arguments(renamed={"threads": "num_threads"}, positional=("num_threads",))
... def open_it(path: str, *, num_threads: int = 1) -> int:
...     return num_threads
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     open_it("p", threads=4), open_it("p", 2)
(4, 2)
>>> [str(w.message) for w in caught]
['threads= is deprecated; chute spells it num_threads=', 'open_it(): pass num_threads= by name']
>>> open_it("p", num_thread=4)
Traceback (most recent call last):
TypeError: open_it() got an unexpected keyword argument 'num_thread'; did you mean 'num_threads'?
"""

from __future__ import annotations

import difflib
import functools
import inspect
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, cast

from chute._util.checks import check_int

P = ParamSpec("P")
R = TypeVar("R")

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def unknown_keyword(where: str, key: str, valid: Collection[str]) -> TypeError:
    """The ``TypeError`` for keyword ``key`` that ``where`` does not take, naming the nearest
    of ``valid`` when one is close.

    >>> str(unknown_keyword("Dataset", "verfy", ["verify", "num_threads"]))
    "Dataset() got an unexpected keyword argument 'verfy'; did you mean 'verify'?"
    """
    close = difflib.get_close_matches(key, list(valid), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return TypeError(f"{where}() got an unexpected keyword argument {key!r}{hint}")


def move_renamed(
    where: str,
    renamed: Mapping[str, str],
    kwargs: dict[str, Any],
    *,
    origin: str = "deprecated",
    stacklevel: int = 3,
) -> None:
    """Move each old keyword of ``renamed`` (old -> new) in ``kwargs`` to its new name, with a
    `DeprecationWarning` ("``old= is {origin}; chute spells it new=``"); both spellings
    given is a ``TypeError`` naming both."""
    for old, new in renamed.items():
        if old not in kwargs:
            continue
        if new in kwargs:
            raise TypeError(f"{where}() got both {old}= ({origin}) and {new}=")
        kwargs[new] = kwargs.pop(old)
        warnings.warn(
            f"{old}= is {origin}; chute spells it {new}=", DeprecationWarning, stacklevel=stacklevel
        )


def call_threads(where: str, num_threads: object, threads: object, default: int) -> int:
    """The cores one call of a batch method (``gather`` ...) may use: its ``num_threads=``,
    or the deprecated ``threads=`` (with the warning `move_renamed` gives; both given is a
    ``TypeError``), checked as every integer option is, else ``default`` (the handle's).
    Inline rather than a keyword-translating wrapper: this runs once per batch.

    >>> call_threads("RecordStore.gather", None, None, 8), call_threads("gather", 2, None, 8)
    (8, 2)
    """
    if threads is not None:
        if num_threads is not None:
            raise TypeError(f"{where}() got both threads= (deprecated) and num_threads=")
        warnings.warn(
            "threads= is deprecated; chute spells it num_threads=", DeprecationWarning, stacklevel=3
        )
        num_threads = threads
    if num_threads is None:
        return default
    return check_int("num_threads", num_threads, minimum=1)


def legacy_arguments(
    *, renamed: Mapping[str, str] | None = None, positional: Sequence[str] = ()
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a public function (or ``__init__``) whose arguments were renamed or made
    keyword-only: ``renamed`` maps old keywords to new ones; ``positional`` names, in their
    old order, the now keyword-only arguments a caller may still pass by position (with a
    warning). Unless the function takes ``**kwargs``, an unknown keyword is a ``TypeError``
    naming the nearest valid one."""
    old_names = dict(renamed or {})

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        params = list(inspect.signature(func).parameters.values())
        taken = sum(p.kind in _POSITIONAL for p in params)
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        valid = [p.name for p in params if p.kind not in _VARIADIC and p.name != "self"]
        where = func.__qualname__.removesuffix(".__init__")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            extra = args[taken:]
            if extra and len(extra) <= len(positional):
                names = positional[: len(extra)]
                for name, value in zip(names, extra, strict=True):
                    if name in kwargs:
                        raise TypeError(f"{where}() got multiple values for argument {name!r}")
                    kwargs[name] = value
                warnings.warn(
                    f"{where}(): pass {', '.join(n + '=' for n in names)} by name",
                    DeprecationWarning,
                    stacklevel=2,
                )
                args = args[:taken]
            move_renamed(where, old_names, kwargs)
            if not open_ended:
                for key in kwargs:
                    if key not in valid:
                        raise unknown_keyword(where, key, valid)
            return func(*args, **kwargs)

        return cast(Callable[P, R], wrapper)

    return wrap
