"""KEDA's scaling of a pool, written out: a rendered ScaledObject's triggers evaluated on a Redis and the
replica count the HPA would ask for."""

from __future__ import annotations

import math
import re

HPA_TOLERANCE = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance default


def evaluate(formula: str, metrics: dict[str, float]) -> float:
    """The formula as KEDA's expr (expr-lang) evaluates it, for the subset the chart writes: names,
    integers, `+`, `<`, `>`, parentheses and `cond ? a : b` (lowest precedence, right-associative)."""
    tokens = re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\d+|[-+<>?:()*/]", formula)
    assert "".join(tokens) == re.sub(r"\s+", "", formula), f"unexpected characters in {formula!r}"
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        tok = tokens[pos]
        assert expected is None or tok == expected, (tok, expected, formula)
        pos += 1
        return tok

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def atom() -> float:
        tok = take()
        if tok == "(":
            value = ternary()
            take(")")
            return value
        assert tok not in "+<>?:)*/-", f"unexpected {tok!r} in {formula!r}"
        return float(tok) if tok.isdigit() else metrics[tok]

    def total() -> float:
        value = atom()
        while peek() == "+":
            take()
            value += atom()
        return value

    def ternary() -> float:
        value = total()
        if peek() in ("<", ">"):
            op, right = take(), total()
            value = float(value < right if op == "<" else value > right)
        if peek() == "?":
            take()
            yes = ternary()
            take(":")
            no = ternary()
            return yes if value else no
        return value

    result = ternary()
    assert pos == len(tokens), f"trailing {tokens[pos:]} in {formula!r}"
    return result


def desired_replicas(so: dict, lengths: dict[str, int], current: int) -> int:
    """What KEDA + the HPA ask for, given each Redis key's length and the current replica count."""
    spec = so["spec"]
    modifiers = spec["advanced"]["scalingModifiers"]
    assert modifiers["metricType"] == "AverageValue"
    metrics = {t["name"]: lengths.get(t["metadata"]["listName"], 0) for t in spec["triggers"]}
    total = evaluate(modifiers["formula"], metrics)
    lo, hi = spec["minReplicaCount"], spec["maxReplicaCount"]
    if total <= float(modifiers["activationTarget"]):
        return lo  # KEDA deactivates the pool (to minReplicaCount, 0 here) after the cooldown
    target = float(modifiers["target"])
    if current > 0 and abs(total / (target * current) - 1) <= HPA_TOLERANCE:
        return current
    return min(hi, max(lo, 1, math.ceil(total / target)))
