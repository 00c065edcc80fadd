"""Reading a judge's verdict: a badly written one is an "unparsed" outcome, counted and shown, never a tie.

Pairwise (MT-Bench's format): the last `[[A]]`, `[[B]]` or `[[C]]` (tie) the judge wrote. Single:
the last `[[n]]` with n in 1-10 (MT-Bench's `Rating: [[n]]`). Anything else, or both A and B
claimed as the final word, is UNPARSED.
"""

from __future__ import annotations

import re
from enum import Enum

_PAIR = re.compile(r"\[\[\s*([ABC])\s*\]\]")
_GRADE = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]")
GRADES = (1.0, 10.0)  # the grade's scale (MT-Bench's single mode), its lowest and highest


class Verdict(str, Enum):
    A = "A"  # the first answer shown is better
    B = "B"
    TIE = "tie"
    UNPARSED = "unparsed"
    FAILED = "failed"  # no answer from the judge (retries spent, time budget over)


def parse_pairwise(text: str | None) -> Verdict:
    """The judge's final pairwise verdict; UNPARSED where it wrote none in the format asked."""
    found = _PAIR.findall(text or "")
    if not found:
        return Verdict.UNPARSED
    return {"A": Verdict.A, "B": Verdict.B, "C": Verdict.TIE}[found[-1]]


def parse_grade(text: str | None) -> float | None:
    """The judge's 1-10 grade; None (unparsed) where it wrote none or one outside 1-10."""
    found = _GRADE.findall(text or "")
    if not found:
        return None
    value = float(found[-1])
    return value if GRADES[0] <= value <= GRADES[1] else None


def combine_orders(first: Verdict, swapped: Verdict) -> Verdict:
    """One pair's outcome for the variant from its two verdicts (MT-Bench's position-bias control).

    `first`: the verdict with the variant shown as A; `swapped`: with the variant shown as B. Returns
    A (the variant wins), B (the baseline wins), TIE, UNPARSED or FAILED (either order unusable). As in
    MT-Bench, an answer wins only where it is preferred in both orders: a verdict that changes with
    the order (A then A: each time the first shown won; or a win in one order, a tie in the other) is a TIE."""
    for bad in (Verdict.FAILED, Verdict.UNPARSED):
        if bad in (first, swapped):
            return bad
    if first is Verdict.A and swapped is Verdict.B:
        return Verdict.A
    if first is Verdict.B and swapped is Verdict.A:
        return Verdict.B
    return Verdict.TIE
