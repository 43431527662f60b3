"""gha.evaluate: GitHub's expression language as the workflow guards use it."""

from __future__ import annotations

import math

import pytest

from repo.gha import UnsupportedExpression, evaluate, strip_braces, to_string, truthy
from repo.workflow_rules import SAFE_LABEL, pr_context


def test_expression_evaluator() -> None:
    ctx = pr_context(fork=True, action="labeled", labels=("A", SAFE_LABEL), label="A")
    assert evaluate("${{ github.event_name == 'PULL_REQUEST' }}", ctx) is True  # case-insensitive strings
    assert evaluate("contains(github.event.pull_request.labels.*.name, 'safe-to-test')", ctx) is True
    assert evaluate("github.event.pull_request.head.repo.full_name == github.repository", ctx) is False
    assert evaluate("github.event['label'].name", ctx) == "A"
    assert evaluate("!(1 == 2) && 'x' || 'y'", ctx) == "x"
    assert evaluate("null == 0 && '' == 0 && 'it''s' == 'IT''S'", ctx) is True
    assert evaluate("github.no.such.thing", ctx) is None
    assert evaluate("startsWith(github.ref, 'refs/pull/') && endsWith(github.ref, '/MERGE')", ctx) is True
    with pytest.raises(UnsupportedExpression):
        evaluate("fromJSON('[]')", ctx)
    with pytest.raises(UnsupportedExpression):
        evaluate("github.event_name == ", ctx)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("1 == '1'", True),  # mixed types compare as numbers
        ("'0x10' == 16", True),
        ("'abc' == 0", False),  # NaN equals nothing
        ("true == 1 && false == 0", True),
        ("'' || 'fallback'", "fallback"),  # || and && return an operand, not a bool
        ("0 && 'never'", 0),
        ("2 >= 1.5 && 'b' < 'a' == false", True),
        ("contains('Hello', 'ELL')", True),
        ("contains(fromlist.*, 'B')", True),
        ("fromlist[1]", None),  # only objects have properties here: index access reads nothing
    ],
)
def test_operators_and_types(expr: str, want: object) -> None:
    assert evaluate(expr, {"fromlist": {"x": "a", "y": "b"}}) == want


def test_object_filter_maps_property_access() -> None:
    ctx = {"needs": {"a": {"result": "success"}, "b": {"result": "failure"}, "c": {}}}
    assert evaluate("needs.*.result", ctx) == ["success", "failure"]  # missing properties are dropped
    assert evaluate("contains(needs.*.result, 'FAILURE')", ctx) is True


def test_truthiness_and_strings() -> None:
    assert [truthy(v) for v in (0, "", None, False, math.nan)] == [False] * 5
    assert [truthy(v) for v in ("false", [], {}, 0.5)] == [True] * 4  # any non-empty string, any object
    assert (to_string(True), to_string(None), to_string(3)) == ("true", "", "3")
    assert strip_braces("  ${{ always() }} ") == "always()"


@pytest.mark.parametrize("expr", ["a ==", "(a", "a b", "#", "format('{0}', a)", "a.'b'"])
def test_what_cannot_be_read_is_refused(expr: str) -> None:
    with pytest.raises(UnsupportedExpression):
        evaluate(expr, {"a": 1})
