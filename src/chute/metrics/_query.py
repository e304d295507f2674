r"""A small query language over a run's config and summary values, such as
``lr < 1e-3 and model.depth in [12, 24] and not name ~ '^smoke'``, to filter runs in
`chute metrics ls DIR --where QUERY` and in the dashboard (`chute metrics serve`).

A query is parsed here by hand, never evaluated as Python: it reads one row (a flat mapping
of names to JSON-like values, `flatten_config` for a config) and nothing else, and its size
is bounded (`MAX_CHARS` characters, `MAX_DEPTH` levels of nesting, `MAX_ITEMS` items a
list), so a query typed into a web page is safe to parse. Grammar, keywords in any case::

    expr  := conj ('or' conj)*             conj := neg ('and' neg)*
    neg   := 'not' neg | atom              op   := '==' | '=' | '!=' | '<' | '<=' | '>' | '>=' | '~'
    atom  := '(' expr ')' | field [op value | 'in' list | 'not' 'in' list]
    value := number | string | 'true' | 'false' | 'null' | list
    list  := '[' [value (',' value)* [',']] ']'

A field is a name ``[A-Za-z_][A-Za-z0-9_./:-]*`` other than a keyword (``and or not in true
false null inf nan``), or any text but a backquote in backquotes (```odd name```). A number
is decimal (``12``, ``-3``, ``1e-3``, ``.5``) or ``inf``, ``-inf``, ``nan``; an int if it
has no point and no exponent. A string is in '...' or "..."; ``\n \t \r \\ \' \"`` are
escapes, and any other backslash stays, with its character (``name ~ "\d+"`` works).

Semantics of a test ``field op value``:

- a field missing from the row makes the test false, whatever the operator: ``lr != 1`` is
  false for a run without ``lr``, while ``not lr == 1`` is true;
- a bare field is true when present and truthy (Python's `bool`: NaN is truthy, {} not);
- numbers (int and float, mixed) compare as numbers, but bool is not one: ``1 == true`` is
  false; strings compare with strings (by code point); other values are equal only if of
  one type and equal (true, null), lists item by item under these rules;
- ``<  <=  >  >=`` between any other pair than two numbers or two strings are false, never
  an error; the query's value must be a number or a string;
- ``~`` searches the pattern (compiled at parse time) in a string, false for any other
  value; patterns are RE2's (linear time in the text, whatever the pattern: a query sent
  to a dashboard cannot stall it), so no backreferences or lookaround;
- NaN equals nothing, itself included: every test of it is false but ``!=`` and ``not in``;
- ``in`` is true when the value equals an item of the list, ``not in`` when it equals none.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import re2

from chute.errors import QueryError

if TYPE_CHECKING:
    from ._reader import Reader

MAX_CHARS = 2000
MAX_DEPTH = 32
MAX_ITEMS = 1000

_NAME_CHAR = r"[A-Za-z0-9_./:-]"
#: RE2 reports a bad pattern as an exception, not also on stderr.
_RE2 = re2.Options()
_RE2.log_errors = False

_LEX = re.compile(
    rf"""(?P<space>\s+)
    |(?P<num>[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf|nan))(?!{_NAME_CHAR}))
    |(?P<badnum>[+-]?\.?\d[A-Za-z0-9_./:+-]*)
    |(?P<name>[A-Za-z_]{_NAME_CHAR}*)
    |(?P<quoted>`[^`]*`)
    |(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    |(?P<op>(?:[=!<>]=|[=<>~])(?![=!<>~]))
    |(?P<badop>[=!<>~]+)
    |(?P<punct>[()\[\],])""",
    re.VERBOSE | re.DOTALL,
)
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None}
_KEYWORDS = {"and", "or", "not", "in", *_CONSTANTS}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}
_BAD = {"badnum": "bad number {!r}", "badop": "unknown operator {!r}"}
_MISSING = object()


def flatten_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with nested mappings flattened to dotted keys; other values (lists too) kept.

    An empty mapping is kept as ``{}`` (the key stays present, and falsy). When two keys
    flatten to the same name (``"a.b"`` and ``{"a": {"b": ...}}``) the later one wins.

    >>> flatten_config({"model": {"depth": 12, "act": "gelu"}, "betas": [0.9, 0.95], "x": {}})
    {'model.depth': 12, 'model.act': 'gelu', 'betas': [0.9, 0.95], 'x': {}}
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update((f"{key}.{k}", v) for k, v in flatten_config(value).items())
        else:
            out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def run_row(config: Mapping[str, Any], last: Mapping[str, Any], **own: Any) -> dict[str, Any]:
    """The row a query reads of one run: the last values of metrics (`last`), the run's own
    fields (`own`: ``run``, ``status``... as the caller knows them), and its flattened config,
    each key also as ``config.KEY``; a config key wins over a run field or a metric."""
    return {**last, **own, **config, **{f"config.{k}": v for k, v in config.items()}}


def last_values(r: Reader, names: Iterable[str]) -> dict[str, Any]:
    """The value at the last row of each named metric the run has (None for no rows yet)."""
    out: dict[str, Any] = {}
    for name in names:
        if name in r.metrics():
            value = r.metric(name, idx=-1, dtype="storage")[1] if r.rows(name) else None
            out[name] = value.item() if isinstance(value, np.generic) else value
    return out


def _is_num(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _equal(a: Any, b: Any) -> bool:
    """``==`` of the language: numbers with numbers, lists item by item, else same type."""
    if _is_num(a) or _is_num(b):
        return _is_num(a) and _is_num(b) and bool(a == b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return type(a) is type(b) and bool(a == b)


def _ordered(a: Any, b: Any) -> bool:  # whether `<` and the like apply to `a` and `b`
    return (_is_num(a) and _is_num(b)) or (isinstance(a, str) and isinstance(b, str))


_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "": lambda value, _: bool(value),
    "==": _equal,
    "!=": lambda value, x: not _equal(value, x),
    "<": lambda a, b: _ordered(a, b) and a < b,
    "<=": lambda a, b: _ordered(a, b) and a <= b,
    ">": lambda a, b: _ordered(a, b) and a > b,
    ">=": lambda a, b: _ordered(a, b) and a >= b,
    "~": lambda value, pattern: isinstance(value, str) and pattern.search(value) is not None,
    "in": lambda value, items: any(_equal(value, x) for x in items),
    "not in": lambda value, items: not any(_equal(value, x) for x in items),
}

_Node = Callable[[Mapping[str, Any]], bool]


def _test(name: str, op: str, arg: Any) -> _Node:
    """A field's test: `op` a key of `_TESTS`, `arg` its value (a pattern for ``~``)."""
    check = _TESTS[op]
    return lambda row: (value := row.get(name, _MISSING)) is not _MISSING and check(value, arg)


@dataclasses.dataclass(frozen=True)
class Query:
    """A parsed query (`parse`): its `text`, the `fields` it reads, and `matches(row)`."""

    text: str
    fields: frozenset[str]
    _node: _Node = dataclasses.field(repr=False, compare=False)

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether the row (names to values) passes the query."""
        return self._node(row)


class _Tok(NamedTuple):
    kind: str  # a group of _LEX, a keyword, a punctuation mark, or "end"
    text: str
    pos: int

    def desc(self) -> str:
        return "the end" if self.kind == "end" else repr(self.text)


def _lex(text: str) -> list[_Tok]:
    toks, pos = [], 0
    while pos < len(text):
        m = _LEX.match(text, pos)
        if m is None:
            what = {"'": "string", '"': "string", "`": "backquoted field"}.get(text[pos])
            problem = f"unterminated {what}" if what else f"unexpected character {text[pos]!r}"
            raise QueryError(problem, pos)
        kind, word = str(m.lastgroup), m.group()
        if kind in _BAD:
            raise QueryError(_BAD[kind].format(word), pos)
        if kind == "punct" or (kind == "name" and word.lower() in _KEYWORDS):
            kind = word.lower()  # a keyword or a punctuation mark is a kind of its own
        if kind != "space":
            toks.append(_Tok(kind, word, pos))
        pos = m.end()
    return [*toks, _Tok("end", "", len(text))]


class _Parser:
    """Recursive descent over the tokens of one query; `fields` collects the names read."""

    def __init__(self, text: str) -> None:
        self.toks, self.i, self.depth = _lex(text), 0, 0
        self.fields: set[str] = set()

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self, *kinds: str, what: str = "") -> _Tok:
        """The next token, of one of `kinds` if given (else `what` was expected), moved past."""
        tok = self.toks[self.i]
        if kinds and tok.kind not in kinds:
            raise QueryError(f"{what}, found {tok.desc()}", tok.pos)
        self.i += tok.kind != "end"
        return tok

    def skip(self, kind: str) -> bool:
        """Whether the next token is of `kind`, moving past it if so."""
        self.i += (found := self.peek().kind == kind)
        return found

    def nested(self, tok: _Tok, inner: Callable[[], Any]) -> Any:
        """`inner()` one level deeper than here, opened by `tok`."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise QueryError(f"nested deeper than {MAX_DEPTH} levels", tok.pos)
        out = inner()
        self.depth -= 1
        return out

    def chain(self, word: str, part: Callable[[], _Node], combine: Callable[..., bool]) -> _Node:
        parts = [part()]
        while self.skip(word):
            parts.append(part())
        nodes = tuple(parts)
        return nodes[0] if len(nodes) == 1 else lambda row: combine(n(row) for n in nodes)

    def expr(self) -> _Node:
        return self.chain("or", lambda: self.chain("and", self.neg, all), any)

    def neg(self) -> _Node:
        tok = self.peek()
        if not self.skip("not"):
            return self.atom()
        node: _Node = self.nested(tok, self.neg)
        return lambda row: not node(row)

    def atom(self) -> _Node:
        tok = self.take()
        if tok.kind == "(":
            node: _Node = self.nested(tok, self.expr)
            self.take(")", what=f"unclosed '(' at {tok.pos}: expected ')'")
            return node
        if tok.kind in ("name", "quoted"):
            name = tok.text[1:-1] if tok.kind == "quoted" else tok.text
        else:
            reserved = tok.kind in _KEYWORDS or tok.text.lower().lstrip("+-") in ("inf", "nan")
            hint = " (put a field of that name in backquotes)" if reserved else ""
            raise QueryError(f"expected a field, found {tok.desc()}{hint}", tok.pos)
        self.fields.add(name)
        after = self.peek()
        if after.kind == "op":
            self.i += 1
            return _test(name, "==" if after.text == "=" else after.text, self.operand(after))
        negate = self.skip("not")
        if negate:
            self.take("in", what="expected 'in' after 'not'")
        elif not self.skip("in"):
            return _test(name, "", None)
        start = self.take("[", what="expected a list '[...]' after 'in'")
        return _test(name, "not in" if negate else "in", self.nested(start, self.items))

    def operand(self, op: _Tok) -> Any:
        tok = self.peek()
        value = self.value(f"after {op.text!r}")
        if op.text == "~":
            if not isinstance(value, str):
                raise QueryError("'~' takes a regular expression in quotes", tok.pos)
            try:
                return re2.compile(value, _RE2)
            except re2.error as e:
                why = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else e
                raise QueryError(
                    f"bad regular expression ({why}; patterns are RE2's: no backreferences "
                    "or lookaround)",
                    tok.pos,
                ) from None
        if op.text[0] in "<>" and not (_is_num(value) or isinstance(value, str)):
            raise QueryError(f"{op.text!r} orders numbers or strings, not {tok.desc()}", tok.pos)
        return value

    def value(self, where: str) -> Any:
        tok = self.take()
        if tok.kind == "num":
            return float(tok.text) if any(c in tok.text for c in ".eEnN") else int(tok.text)
        if tok.kind == "str":
            body = tok.text[1:-1]
            return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[0]), body, flags=re.DOTALL)
        if tok.kind in _CONSTANTS:
            return _CONSTANTS[tok.kind]
        if tok.kind == "[":
            return self.nested(tok, self.items)
        raise QueryError(f"expected a value {where}, found {tok.desc()}", tok.pos)

    def items(self) -> tuple[Any, ...]:
        """The items of a list, after its '[', through its ']'."""
        items: list[Any] = []
        while self.peek().kind != "]":
            if len(items) == MAX_ITEMS:
                raise QueryError(f"a list longer than {MAX_ITEMS} items", self.peek().pos)
            items.append(self.value("in the list"))
            if self.peek().kind != "]":
                self.take(",", what="expected ',' or ']' in the list")
        self.i += 1
        return tuple(items)


def parse(text: str) -> Query:
    """The query `text` parsed (a blank one matches every row). A `QueryError` names the
    problem and its position, counted in characters from 0 (also in its ``position``).

    >>> q = parse("(lr < 1e-3 or opt == 'adam') and not `odd name`")
    >>> sorted(q.fields), q.matches({"lr": 3e-4, "odd name": 0})
    (['lr', 'odd name', 'opt'], True)
    """
    if len(text) > MAX_CHARS:
        raise QueryError(f"query longer than {MAX_CHARS} characters ({len(text)})", MAX_CHARS)
    p = _Parser(text)
    node = p.expr() if p.peek().kind != "end" else lambda row: True
    p.take("end", what="expected 'and', 'or' or the end")
    return Query(text, frozenset(p.fields), node)
