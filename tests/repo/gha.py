"""GitHub Actions' expression language (`${{ }}`, `if:`), enough of it to evaluate a job's guard in a test.

`evaluate(expr, context)` follows GitHub's rules: case-insensitive string comparison, loose == across types
(compared as numbers), `&&`/`||` returning an operand, `.*` object filters, and the functions the guards
use (contains, startsWith, endsWith, and the status functions, which read as a successful run). Anything
else raises UnsupportedExpression: a guard this cannot read is reported, not guessed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any


class UnsupportedExpression(ValueError):
    pass


_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
    r"|(?P<op>&&|\|\||==|!=|<=|>=|<|>|!|\(|\)|\[|\]|\.|,|\*)|(?P<ident>[A-Za-z_][A-Za-z0-9_-]*))"
)


class _Filtered(list):
    """The result of a `.*` object filter: a following property access maps over the elements."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos, expr = [], 0, expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise UnsupportedExpression(f"cannot read {expr[pos:]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _number(v: Any) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return 0.0
        try:
            return float(int(s, 16)) if s.lower().startswith("0x") else float(s)
        except ValueError:
            return math.nan
    return math.nan


def truthy(v: Any) -> bool:
    if isinstance(v, float) and math.isnan(v):
        return False
    return v not in (False, None, 0, "") if not isinstance(v, list | dict) else True


def loose_eq(a: Any, b: Any) -> bool:
    """GitHub's ==: strings compare case-insensitively; mixed types are compared as numbers."""
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        return a is b
    if type(a) is type(b):
        return a == b
    return _number(a) == _number(b)


def _contains(search: Any, item: Any) -> bool:
    if isinstance(search, list):
        return any(loose_eq(x, item) for x in search)
    return str(item if item is not None else "").casefold() in str(search if search is not None else "").casefold()


def to_string(v: Any) -> str:
    return "" if v is None else ("true" if v is True else "false" if v is False else str(v))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "contains": _contains,
    "startswith": lambda a, b: to_string(a).casefold().startswith(to_string(b).casefold()),
    "endswith": lambda a, b: to_string(a).casefold().endswith(to_string(b).casefold()),
    "always": lambda: True,
    "success": lambda: True,
    "failure": lambda: False,
    "cancelled": lambda: False,
}


class _Parser:
    def __init__(self, expr: str, context: dict) -> None:
        self.toks, self.i, self.ctx = _tokens(expr), 0, context

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks) or (want is not None and self.toks[self.i][1] != want):
            raise UnsupportedExpression(f"expected {want!r} at token {self.i}")
        self.i += 1
        return self.toks[self.i - 1]

    def parse(self) -> Any:
        v = self.or_()
        if self.i != len(self.toks):
            raise UnsupportedExpression(f"unexpected {self.peek()!r}")
        return v

    def or_(self) -> Any:
        v = self.and_()
        while self.peek() == "||":
            self.take()
            rhs = self.and_()
            v = v if truthy(v) else rhs
        return v

    def and_(self) -> Any:
        v = self.cmp()
        while self.peek() == "&&":
            self.take()
            rhs = self.cmp()
            v = rhs if truthy(v) else v
        return v

    def cmp(self) -> Any:
        v = self.unary()
        while self.peek() in ("==", "!=", "<", "<=", ">", ">="):
            op = self.take()[1]
            rhs = self.unary()
            if op in ("==", "!="):
                v = loose_eq(v, rhs) == (op == "==")
            else:
                a, b = _number(v), _number(rhs)
                v = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        return v

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not truthy(self.unary())
        return self.postfix()

    def postfix(self) -> Any:
        v = self.primary()
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                kind, name = self.take()
                if name == "*":
                    v = self.star(v)
                elif kind == "ident":
                    v = self.prop(v, name)
                else:
                    raise UnsupportedExpression(f"bad property {name!r}")
            else:
                if self.peek() == "*":
                    self.take()
                    v = self.star(v)
                else:
                    v = self.prop(v, to_string(self.or_()))
                self.take("]")
        return v

    @staticmethod
    def star(v: Any) -> _Filtered:
        if isinstance(v, dict):
            return _Filtered(v.values())
        return _Filtered(v if isinstance(v, list) else [])

    def prop(self, v: Any, name: str) -> Any:
        if isinstance(v, _Filtered):
            return _Filtered(x for x in (self.prop(e, name) for e in v) if x is not None)
        if isinstance(v, dict):
            for k, val in v.items():
                if str(k).casefold() == name.casefold():
                    return val
        return None

    def primary(self) -> Any:
        kind, tok = self.take()
        if kind == "str":
            return tok[1:-1].replace("''", "'")
        if kind == "num":
            return _number(tok)
        if tok == "(":
            v = self.or_()
            self.take(")")
            return v
        if kind != "ident":
            raise UnsupportedExpression(f"unexpected {tok!r}")
        if tok in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[tok]
        if self.peek() == "(":
            fn = FUNCTIONS.get(tok.casefold())
            if fn is None:
                raise UnsupportedExpression(f"function {tok}() is not modelled here")
            self.take("(")
            args = []
            while self.peek() != ")":
                args.append(self.or_())
                if self.peek() == ",":
                    self.take()
            self.take(")")
            return fn(*args)
        return self.prop(self.ctx, tok)


def strip_braces(expr: str) -> str:
    s = expr.strip()
    return s[3:-2].strip() if s.startswith("${{") and s.endswith("}}") else s


def evaluate(expr: str, context: dict) -> Any:
    return _Parser(strip_braces(expr), context).parse()
