"""The run query language (`chute.metrics._query`) and `chute metrics ls DIR --where`."""

from __future__ import annotations

import dataclasses
import math
import operator
import random
import re
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from chute.errors import ChuteError
from chute.metrics import DirectWriter, QueryError, _query
from chute.metrics._cli import main
from chute.metrics._query import flatten_config, parse

NAN, INF = float("nan"), float("inf")

ROW: dict[str, Any] = {
    "i": 3,
    "f": 2.5,
    "z": 0,
    "s": "abc",
    "t": True,
    "fl": False,
    "n": None,
    "l": [1, 2],
    "e": [],
    "d": {},
    "x_nan": NAN,
    "x_inf": INF,
    "big": 12345678901234567890,
    "q": "it's",
    "q2": 'a"b',
    "nl": "a\nb",
    "v": "v12",
    "odd name": 1,
    "": 3,
    "and": 2,
    "train/loss": 0.5,
    "model.depth": 12,
    "gpu:0": 1,
    "x-y": 2,
}

CASES = [
    # numbers, int and float mixed
    ("i == 3", True), ("i = 3", True), ("i == 3.0", True), ("i != 3", False),
    ("i != 4", True), ("i < 4", True), ("i <= 3", True), ("i > 3", False), ("i >= 3", True),
    ("f < 3", True), ("f > 2", True), ("f == 25e-1", True), ("f == .25e1", True),
    ("f == +2.5", True), ("z == -0", True), ("i>-inf", True), ("x_inf > 1e308", True),
    ("x_inf == INF", True), ("big == 12345678901234567890", True),
    ("big == 12345678901234567890.0", False),  # exact: that float is ...7168
    # strings
    ("s == 'abc'", True), ('s == "abc"', True), ("s < 'abd'", True), ("s > 'ab'", True),
    ("s >= 'abc'", True), ("s != 'abc'", False), (r"q == 'it\'s'", True),
    (r'q2 == "a\"b"', True), (r"nl == 'a\nb'", True), ("q == \"it's\"", True),
    # regex search
    ("s ~ 'b'", True), ("s ~ '^b'", False), ("s ~ 'B'", False), ("s ~ '(?i)B'", True),
    (r'v ~ "\d+$"', True), (r"v ~ '^v\\d'", True), ("i ~ '3'", False), ("l ~ ''", False),
    # a missing field makes every test false
    ("missing == 1", False), ("missing != 1", False), ("not missing == 1", True),
    ("missing < 1", False), ("missing ~ ''", False), ("missing in [1]", False),
    ("missing not in [1]", False), ("missing", False), ("not missing", True),
    # bool is not a number
    ("t == true", True), ("t == 1", False), ("t != 1", True), ("i == true", False),
    ("fl == false", True), ("fl == 0", False), ("z == false", False), ("t > 0", False),
    ("t in [1]", False), ("fl in [0, false]", True),
    # null
    ("n == null", True), ("n != null", False), ("i == null", False), ("n < 1", False),
    ("n in [null]", True),
    # mismatched types: unequal, never ordered
    ("s == 3", False), ("s != 3", True), ("s < 3", False), ("i < 'a'", False),
    ("i >= '0'", False), ("l < 3", False), ("d == 0", False),
    # lists
    ("l == [1, 2]", True), ("l == [1.0, 2,]", True), ("l == [1]", False),
    ("l != [2, 1]", True), ("l == [true, 2]", False), ("e == []", True),
    ("l in [[1, 2], 3]", True), ("l in [1, 2]", False),
    # NaN equals nothing: false but for != and not in
    ("x_nan == nan", False), ("x_nan != nan", True), ("x_nan < 1", False),
    ("x_nan >= 1", False), ("x_nan != 1", True), ("x_nan in [nan]", False),
    ("x_nan not in [nan]", True), ("f == nan", False), ("f != nan", True),
    # bare fields: present and truthy
    ("i", True), ("z", False), ("s", True), ("e", False), ("l", True), ("d", False),
    ("t", True), ("fl", False), ("n", False), ("x_nan", True),
    # in / not in
    ("i in [1, 2, 3]", True), ("i in [3.0]", True), ("i in []", False),
    ("i not in [1, 2]", True), ("i not in [3]", False), ("s in ['abc', 1]", True),
    # keywords in any case, field names
    ("t == TRUE and n == Null", True), ("i In [3] AND i NOT iN [4]", True),
    ("NOT i == 4 OR FALSE_field", True), ("`odd name` == 1 and `and` == 2", True),
    ("`` == 3 and `model.depth` == 12", True),
    ("train/loss < 1 and model.depth == 12 and gpu:0 == 1 and x-y == 2", True),
    # the empty query matches everything
    ("", True), ("  \n ", True),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_semantics(text: str, expected: bool) -> None:
    assert parse(text).matches(ROW) is expected


@pytest.mark.parametrize(
    ("text", "a", "b", "c", "expected"),
    [
        ("a or b and c", 1, 1, 0, True),  # a or (b and c)
        ("(a or b) and c", 1, 1, 0, False),
        ("a and b or c", 0, 0, 1, True),  # (a and b) or c
        ("a and (b or c)", 0, 0, 1, False),
        ("not a and b", 0, 0, 0, False),  # (not a) and b
        ("not (a and b)", 0, 0, 0, True),
        ("not not a", 1, 0, 0, True),
        ("not a or c", 1, 0, 1, True),
        ("((a))", 1, 0, 0, True),
        ("not a in [1]", 1, 0, 0, False),  # not (a in [1])
    ],
)
def test_precedence(text: str, a: int, b: int, c: int, expected: bool) -> None:
    assert parse(text).matches({"a": a, "b": b, "c": c}) is expected


def test_query_value_object() -> None:
    q = parse("(lr < 1e-3 or `opt name` == 'adam') and not model.depth in [12]")
    assert q.text == "(lr < 1e-3 or `opt name` == 'adam') and not model.depth in [12]"
    assert q.fields == frozenset({"lr", "opt name", "model.depth"})
    assert parse("").fields == frozenset()
    assert q == parse(q.text)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.text = "x"  # type: ignore[misc]


ERRORS = [
    ("(a", "unclosed '(' at 0: expected ')', found the end", 2),
    ("((a == 1)", "unclosed '(' at 0: expected ')', found the end", 9),
    ("(a b)", "unclosed '(' at 0: expected ')', found 'b'", 3),
    ("a)", "expected 'and', 'or' or the end, found ')'", 1),
    ("a == 1 b", "expected 'and', 'or' or the end, found 'b'", 7),
    ("a == 1 2", "expected 'and', 'or' or the end, found '2'", 7),
    ("depth >", "expected a value after '>', found the end", 7),
    ("depth > and b", "expected a value after '>', found 'and'", 8),
    ("depth == b", "expected a value after '==', found 'b'", 9),
    ("a <> 1", "unknown operator '<>'", 2),
    ("a => 1", "unknown operator '=>'", 2),
    ("a === 1", "unknown operator '==='", 2),
    ("a =~ 'x'", "unknown operator '=~'", 2),
    ("a ! b", "unknown operator '!'", 2),
    ("a == 'abc", "unterminated string", 5),
    ('a == "x\\"', "unterminated string", 5),
    ("`abc == 1", "unterminated backquoted field", 0),
    ("a in 3", "expected a list '[...]' after 'in', found '3'", 5),
    ("a in [1, 2", "expected ',' or ']' in the list, found the end", 10),
    ("a in [1 2]", "expected ',' or ']' in the list, found '2'", 8),
    ("a in [1,,2]", "expected a value in the list, found ','", 8),
    ("a in [,]", "expected a value in the list, found ','", 6),
    ("a not b", "expected 'in' after 'not', found 'b'", 6),
    ("and", "expected a field, found 'and' (put a field of that name in backquotes)", 0),
    ("inf > 1", "expected a field, found 'inf' (put a field of that name in backquotes)", 0),
    ("a and", "expected a field, found the end", 5),
    ("not", "expected a field, found the end", 3),
    ("()", "expected a field, found ')'", 1),
    ("'a' == a", "expected a field, found \"'a'\"", 0),
    ("a ~ 3", "'~' takes a regular expression in quotes", 4),
    ("a ~ '('", "bad regular expression (missing ): (", 4),
    (
        "a ~ '(x)\\\\1'",
        "bad regular expression (invalid escape sequence: \\1; patterns are RE2's",
        4,
    ),
    ("a < true", "'<' orders numbers or strings, not 'true'", 4),
    ("a >= [1]", "'>=' orders numbers or strings, not '['", 5),
    ("a == 1x", "bad number '1x'", 5),
    ("a == 1.2.3", "bad number '1.2.3'", 5),
    ("a > 1-2", "bad number '1-2'", 4),
    ("a & b", "unexpected character '&'", 2),
    ("a == .", "unexpected character '.'", 5),
    ("a == - 1", "unexpected character '-'", 5),
    ("a" * 2001, "query longer than 2000 characters (2001)", 2000),
    ("(" * 33 + "a" + ")" * 33, "nested deeper than 32 levels", 32),
    ("not " * 33 + "a", "nested deeper than 32 levels", 128),
    ("a == " + "[" * 33 + "]" * 33, "nested deeper than 32 levels", 37),
    ("(" * 20 + "not " * 13 + "a" + ")" * 20, "nested deeper than 32 levels", 68),
]


@pytest.mark.parametrize(("text", "message", "position"), ERRORS)
def test_errors_name_the_problem_and_position(text: str, message: str, position: int) -> None:
    with pytest.raises(QueryError) as info:
        parse(text)
    assert str(info.value).startswith(message)
    assert str(info.value).endswith(f" at {position}")
    assert info.value.position == position
    assert isinstance(info.value, ValueError) and isinstance(info.value, ChuteError)
    assert type(info.value).__module__ == "chute.errors"


def test_bounds_are_inclusive() -> None:
    assert parse("a" * 2000).fields == {"a" * 2000}
    assert parse("(" * 32 + "a" + ")" * 32).matches({"a": 1})
    assert parse("not " * 32 + "a").matches({"a": 1})
    assert parse("a in " + "[" * 32 + "]" * 32).matches({"a": 1}) is False


def test_list_items_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_query, "MAX_CHARS", 10_000)  # 1000 items take more than 2000 chars
    assert parse("a in [" + ", ".join(["1"] * 1000) + "]").matches({"a": 1})
    text = "a in [" + ",".join(["1"] * 1001) + "]"
    with pytest.raises(QueryError, match=r"a list longer than 1000 items at 2006$"):
        parse(text)


def test_flatten_config() -> None:
    assert flatten_config({}) == {}
    assert flatten_config({"lr": 0.1, "model": {"depth": 12, "act": {"name": "gelu"}}}) == {
        "lr": 0.1,
        "model.depth": 12,
        "model.act.name": "gelu",
    }
    # lists (of dicts too) and scalars are values; an empty dict stays, falsy
    cfg = {"betas": [0.9, 0.95], "layers": [{"w": 1}], "none": None, "opt": {}}
    assert flatten_config(cfg) == cfg
    assert parse("opt").matches(flatten_config(cfg)) is False
    assert parse("opt == null or opt != null").matches(flatten_config(cfg))  # present
    # two keys flattening to one name: the later one wins
    assert flatten_config({"a.b": 1, "a": {"b": 2}}) == {"a.b": 2}
    assert flatten_config({"a": {"b": 2}, "a.b": 1}) == {"a.b": 1}


# -- random queries against a reference evaluation -----------------------------------------

FIELDS = ["a", "b.c", "train/loss", "x-y", "odd name", "and", "inf", "Not", ""]
_SCALARS = st.one_of(
    st.integers(-2, 2),
    st.sampled_from([0.0, 1.0, -1.5, 2.0, NAN, INF, -INF, 1e-3]),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.text(alphabet="ab'\"\\\n", max_size=3),
)
VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=2))
PATTERNS = st.sampled_from(["a", "^b", "a$", "b.", "", "[ab]{2}", "'", "\\\\", "\\n"])
ROWS = st.dictionaries(st.sampled_from(FIELDS), VALUES)

_LEAVES = st.one_of(
    st.tuples(st.just("test"), st.sampled_from(FIELDS), st.sampled_from(["==", "!="]), VALUES),
    st.tuples(
        st.just("test"),
        st.sampled_from(FIELDS),
        st.sampled_from(["<", "<=", ">", ">="]),
        st.one_of(st.integers(-2, 2), st.floats(), st.text(alphabet="ab", max_size=2)),
    ),
    st.tuples(st.just("test"), st.sampled_from(FIELDS), st.just("~"), PATTERNS),
    st.tuples(
        st.just("test"),
        st.sampled_from(FIELDS),
        st.sampled_from(["in", "not in"]),
        st.lists(VALUES, max_size=3),
    ),
    st.tuples(st.just("test"), st.sampled_from(FIELDS), st.just(""), st.none()),
)
TREES = st.recursive(
    _LEAVES,
    lambda kids: st.one_of(
        st.tuples(st.just("not"), kids),
        st.tuples(st.sampled_from(["and", "or"]), st.lists(kids, min_size=2, max_size=3)),
    ),
    max_leaves=8,
)


def _is_num(v: Any) -> bool:
    return type(v) in (int, float)


def _ref_equal(a: Any, b: Any) -> bool:
    kind_a = "num" if _is_num(a) else "list" if isinstance(a, (list, tuple)) else type(a)
    kind_b = "num" if _is_num(b) else "list" if isinstance(b, (list, tuple)) else type(b)
    if kind_a != kind_b:
        return False
    if kind_a == "list":
        return len(a) == len(b) and all(_ref_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _ref(tree: tuple[Any, ...], row: dict[str, Any]) -> bool:
    if tree[0] == "not":
        return not _ref(tree[1], row)
    if tree[0] == "and":
        return all(_ref(t, row) for t in tree[1])
    if tree[0] == "or":
        return any(_ref(t, row) for t in tree[1])
    _, name, op, lit = tree
    if name not in row:
        return False
    v = row[name]
    if op == "":
        return bool(v)
    if op == "~":
        return isinstance(v, str) and re.search(lit, v) is not None
    if op in ("in", "not in"):
        return any(_ref_equal(v, x) for x in lit) is (op == "in")
    if op in ("==", "!="):
        return _ref_equal(v, lit) is (op == "==")
    same = (_is_num(v) and _is_num(lit)) or (isinstance(v, str) and isinstance(lit, str))
    return same and _ORDER[op](v, lit)


def _case(word: str, rnd: random.Random) -> str:
    return rnd.choice([word, word.upper(), word.title()])


def _render_value(v: Any, rnd: random.Random) -> str:
    if v is None or isinstance(v, bool):
        return _case({None: "null", True: "true", False: "false"}[v], rnd)
    if isinstance(v, float) and math.isinf(v):
        return ("-" if v < 0 else rnd.choice(["", "+"])) + _case("inf", rnd)
    if isinstance(v, float) and math.isnan(v):
        return _case("nan", rnd)
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        quote = rnd.choice("'\"")
        return quote + v.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote
    comma = rnd.choice(["", ","]) if v else ""  # a trailing comma is allowed
    return "[" + ", ".join(_render_value(x, rnd) for x in v) + comma + "]"


def _render_field(name: str) -> str:
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./:-]*", name)
    reserved = name.lower() in {"and", "or", "not", "in", "true", "false", "null", "inf", "nan"}
    return name if plain and not reserved else f"`{name}`"


def _render(tree: tuple[Any, ...], rnd: random.Random, parent: str = "or") -> str:
    """The query text of `tree`, with the parentheses precedence needs and some spare ones."""
    kind = tree[0]
    if kind == "test":
        _, name, op, lit = tree
        text = _render_field(name)
        if op:
            sp = rnd.choice(["", " "]) if op not in ("in", "not in") else " "
            shown = (
                rnd.choice(["=", "=="])
                if op == "=="
                else " ".join(_case(w, rnd) for w in op.split())
            )
            text += sp + shown + sp + _render_value(lit, rnd)
        needs = False
    elif kind == "not":
        text = _case("not", rnd) + " " + _render(tree[1], rnd, "not")
        needs = False
    else:
        sep = f" {_case(kind, rnd)} "
        text = sep.join(_render(t, rnd, kind) for t in tree[1])
        needs = parent == "not" or (parent == "and" and kind == "or")
    return f"({text})" if needs or rnd.random() < 0.1 else text


def _fields(tree: tuple[Any, ...]) -> set[str]:
    if tree[0] == "test":
        return {tree[1]}
    kids = [tree[1]] if tree[0] == "not" else tree[1]
    return set().union(*(_fields(t) for t in kids))


@settings(max_examples=200, deadline=None)
@given(tree=TREES, rows=st.lists(ROWS, min_size=1, max_size=4), rnd=st.randoms())
def test_random_queries_match_reference(
    tree: tuple[Any, ...], rows: list[dict[str, Any]], rnd: random.Random
) -> None:
    text = _render(tree, rnd)
    assume(len(text) <= _query.MAX_CHARS)
    try:
        q = parse(text)
    except QueryError as e:  # a tree nested deeper than the language allows
        assume("nested deeper" not in str(e))
        raise
    assert q.fields == _fields(tree)
    for row in rows:
        assert q.matches(row) is _ref(tree, row), (text, row)


# -- chute metrics ls DIR --where ------------------------------------------------------------


def _runs(tmp_path: Any) -> Any:
    exp = tmp_path / "exp"
    configs = {
        "r1": {"lr": 1e-3, "model": {"depth": 12}, "name": "smoke1"},
        "r2": {"lr": 1e-4, "model": {"depth": 24}, "name": "big"},
        "r3": {},
    }
    for (run, cfg), loss in zip(configs.items(), (0.5, 0.2, 0.9), strict=True):
        with DirectWriter(str(exp / run), config=cfg) as w:
            w.write(loss=loss + 1)
            w.end_step()
            w.write(loss=loss)
            w.end_step()
    return exp


def _listed(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:]]


def test_ls_where_through_python_m(tmp_path: Any) -> None:
    exp = _runs(tmp_path)
    cmd = [sys.executable, "-m", "chute.metrics", "ls", str(exp), "--where"]
    where = "model.depth >= 12 and loss < 0.6 and not name ~ '^big'"
    done = subprocess.run([*cmd, where], capture_output=True, text=True, check=True)
    assert _listed(done.stdout) == ["r1"]
    bad = subprocess.run([*cmd, "lr < 1e-3 and (depth >"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "bad query: expected a value after '>', found the end at 22" in bad.stderr


def test_ls_where_in_process(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    exp = _runs(tmp_path)
    assert main(["ls", str(exp), "--where", "lr != 1"]) == 0  # r3 has no lr
    assert _listed(capsys.readouterr().out) == ["r1", "r2"]
    assert main(["ls", str(exp), "--where", "config.lr < 5e-4 or not lr"]) == 0
    assert _listed(capsys.readouterr().out) == ["r2", "r3"]
    assert main(["ls", str(exp), "--where", "run ~ '[23]$' and status == 'live'"]) == 0
    assert _listed(capsys.readouterr().out) == ["r2", "r3"]  # the run's own fields
    assert main(["ls", str(exp), "--where", "metrics == 1 and name == 'big'"]) == 0
    assert _listed(capsys.readouterr().out) == ["r2"]
    assert main(["ls", str(exp), "--where", "loss > 100"]) == 0
    out = capsys.readouterr()
    assert _listed(out.out) == [] and "no run under" in out.err
    assert main(["ls", str(exp / "r1"), "--where", "lr"]) == 2
    assert "--where filters the runs of a folder" in capsys.readouterr().err


def test_a_pathological_pattern_takes_linear_time() -> None:
    """``~`` runs RE2: a nested quantifier against a long near-match (exponential for a
    backtracking engine, so a query sent to a dashboard could stall it) answers at once. In a
    child process, so a regression fails by timeout instead of hanging the suite."""
    code = (
        "from chute.metrics._query import parse\n"
        "q = parse(\"tag ~ '^(a+)+$'\")\n"
        "print(q.matches({'tag': 'a' * 64 + '!'}), q.matches({'tag': 'a' * 64}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.split() == ["False", "True"]
