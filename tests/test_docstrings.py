"""Every public class and function has a docstring with a runnable example.

The names are those of each public module's ``__all__``; pytest runs the examples themselves
(``--doctest-modules`` over ``src/chute``). Here we check that they exist: a docstring
without a ``>>>`` example fails naming the object, and so does a skipped example (``+SKIP``)
outside the short list of APIs that need a cluster, a server or TensorFlow. Type aliases
cannot carry a runnable example, but each must have an attribute docstring in its source.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import itertools
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import chute

# module -> the third-party package it needs to import at all (None: always importable)
MODULES: dict[str, str | None] = {
    "chute": None,
    "chute.store": None,
    "chute.errors": None,
    "chute.loader": None,
    "chute.datasets": None,
    "chute.metrics": None,
    "chute.metrics.dashboard": "starlette",
    "chute.insitu": "zarr",
    "chute.frameworks": None,
    "chute.ray": None,  # imports Ray only when a function runs
}

# The only objects whose examples may skip lines (+SKIP): they cannot run under `make test`.
MAY_SKIP = {
    "chute.frameworks._tf.as_tf_dataset",  # TensorFlow lives in its own venv (make test-tf)
    "chute.ray.read_dataset",  # a Ray cluster
    "chute.ray.write_dataset",
    "chute.metrics.dashboard._serve.serve",  # serves until interrupted
}

_PARSER = doctest.DocTestParser()
_SRC = Path(chute.__file__).parent


def _module(name: str) -> ModuleType:
    needs = MODULES[name]
    if needs is not None:
        pytest.importorskip(needs)
    return importlib.import_module(name)


def _public(module: ModuleType) -> list[tuple[str, Any]]:
    assert hasattr(module, "__all__"), f"{module.__name__} has no __all__"
    return [(name, getattr(module, name)) for name in module.__all__]


def _qualname(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _problem(obj: Any) -> str | None:
    """What is wrong with the object's own docstring (not one inherited), or None."""
    doc = obj.__doc__
    if not doc:
        return "no docstring"
    examples = _PARSER.get_examples(inspect.cleandoc(doc))
    if not examples:
        return "no >>> example"
    skipped = any(e.options.get(doctest.SKIP) for e in examples)
    if skipped and _qualname(obj) not in MAY_SKIP:
        return "an example is skipped (+SKIP), and the object is not on the MAY_SKIP list"
    return None


def _is_documented_alias(package: ModuleType, name: str) -> bool:
    """Whether a module of ``package``'s directory assigns ``name`` at module level with a
    string literal right after it (the attribute docstring mkdocstrings shows)."""
    where = Path(package.__file__ or "")
    files = where.parent.rglob("*.py") if where.name == "__init__.py" else [where]
    for file in files:
        body = ast.parse(file.read_text()).body
        for stmt, after in itertools.pairwise(body):
            targets: list[ast.expr] = []
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            elif isinstance(stmt, ast.AnnAssign):
                targets = [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                return True
    return False


@pytest.mark.parametrize("name", sorted(MODULES))
def test_public_names_have_examples(name: str) -> None:
    module = _module(name)
    missing = []
    for public, obj in _public(module):
        if inspect.isclass(obj) or inspect.isfunction(obj):
            problem = _problem(obj)
            if problem is not None:
                missing.append(f"{name}.{public} ({_qualname(obj)}): {problem}")
        elif not _is_documented_alias(module, public):
            missing.append(f"{name}.{public}: a type alias with no docstring after it")
    assert not missing, "public names without a runnable docstring example:\n  " + "\n  ".join(
        missing
    )


def test_skip_list_is_current() -> None:
    """Every MAY_SKIP entry names a public object that still skips an example."""
    found = {}
    for name in MODULES:
        try:
            module = _module(name)
        except pytest.skip.Exception:
            continue
        for _, obj in _public(module):
            if inspect.isclass(obj) or inspect.isfunction(obj):
                found[_qualname(obj)] = obj
    for qualname in MAY_SKIP:
        assert qualname in found, f"{qualname} is no longer public: drop it from MAY_SKIP"
        examples = _PARSER.get_examples(inspect.cleandoc(found[qualname].__doc__ or ""))
        assert any(e.options.get(doctest.SKIP) for e in examples), (
            f"{qualname} skips no example now: drop it from MAY_SKIP"
        )


def test_the_check_catches_a_missing_example() -> None:
    """The check itself: an object without an example, or with a skipped one, is named;
    an inherited docstring does not count for a class."""

    def bare() -> None:
        """Does a thing."""

    def skipped() -> None:
        """Does a thing.

        >>> bare()
        >>> bare()  # doctest: +SKIP
        """

    def good() -> None:
        """Does a thing.

        >>> bare()
        """

    class Base:
        """A base.

        >>> Base()  # doctest: +ELLIPSIS
        <...>
        """

    class Child(Base):
        pass

    assert _problem(bare) == "no >>> example"
    assert _problem(skipped) is not None and "skipped" in str(_problem(skipped))
    assert _problem(good) is None
    assert _problem(Base) is None
    assert _problem(Child) == "no docstring"
