"""Task metrics: accuracy against the prompts' gold answers, and the multi-sample metrics.

A generation's answer is read by the sweep's `task:` section (controller.metrics.extract) and is
right when its normal form is one of the prompt's accepted answers. The multi-sample metrics look at
all the generations of a prompt in the cell (a sweep's seeds, and a strategy's `samples`), n of them:

- `exact_match`: the share of generations whose answer is right (of the prompts with a gold answer);
- `answered`: the share of generations from which an answer could be read;
- `pass@<k>`: the chance that at least one of k generations drawn without replacement from the n is
  right, by the unbiased estimator of Chen et al. (2021), 1 − C(n − c, k) / C(n, k) with c right,
  averaged over the prompts with at least k generations;
- `maj@<k>`: self-consistency (Wang et al. 2023): the majority answer of k generations of a prompt
  (those with the k smallest seeds: an order-free, seed-random choice; all of them where n = k) is
  right. Unanswered generations do not vote (none voting: wrong); a tie goes to the answer first in
  code-point order, so a report reads the same whatever the order of its shards;
- `distinct_answers`: distinct answers (unanswered ones not counted) over n, per prompt with n ≥ 2.

The prompt stays the unit: a per-prompt value v of a prompt with n generations enters as n rows of
(v / n, 1 / n), so the value is the mean over prompts and the bootstrap resamples prompts whole. Those metrics
declare it (`Metric.per_prompt`): a prompt's sums are (v, 1) whatever its generations, which the paired test
exchanges between two cells as they are (controller.report.stats.paired).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.extract import task_of
from controller.metrics.registry import METRICS, Metric, additive_metric, item_rows, ratio

CHEN = "Chen et al. 2021, Evaluating Large Language Models Trained on Code (the unbiased pass@k estimator)"
WANG = "Wang et al. 2023, Self-Consistency Improves Chain of Thought Reasoning in Language Models"


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n − c, k) / C(n, k), computed as Chen et al.'s numerically stable product."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent answer (None does not vote; a tie: the first in code-point order), or None."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return min(a for a, n in counts.items() if n == top)


def judged(cell: CellData) -> tuple[list[str | None], list[bool | None]] | None:
    """Each generation's answer and whether it is right (None: its prompt has no gold answer); None where the
    cell is no task's (no gold answer anywhere and no `task:` section: the reference row, a plain sweep)."""
    n = len(cell.texts)
    golds = cell.answers if len(cell.answers) == n else [None] * n
    if cell.task is None and not any(g is not None for g in golds):
        return None
    key = ("judged", n)
    if key not in cell.memo:
        task = task_of(cell.task)
        choices = cell.choices if len(cell.choices) == n else [None] * n
        answers = [task.answer(t, c) for t, c in zip(cell.texts, choices)]
        accepted = {}
        right: list[bool | None] = []
        for a, g, c in zip(answers, golds, choices):
            if g is None:
                right.append(None)
                continue
            at = (tuple(g), tuple(c or ()))
            if at not in accepted:
                accepted[at] = task.accepted(g, c)
            right.append(a is not None and a in accepted[at])
        cell.memo[key] = (answers, right)
    return cell.memo[key]


def _prompts(cell: CellData) -> dict[object, list[int]]:
    """Prompt -> the indices of its generations (each generation its own prompt where ids are missing)."""
    groups: dict[object, list[int]] = defaultdict(list)
    ids = cell.prompt_ids if len(cell.prompt_ids) == len(cell.texts) else [None] * len(cell.texts)
    for i, pid in enumerate(ids):
        groups[pid if pid is not None else ("#", i)].append(i)
    return groups


def per_prompt(cell: CellData, value, *, min_n: int = 1, gold: bool = True) -> np.ndarray | None:
    """Rows of (v / n, 1 / n) for each generation of a prompt with v = value(indices), where the prompt has at least
    `min_n` generations (and a gold answer, if `gold`); (0, 0) for the others; None where no prompt counts."""
    seen = judged(cell)
    if seen is None:
        return None
    _, right = seen
    rows = np.zeros((len(cell.texts), 2))
    counted = False
    for idx in _prompts(cell).values():
        if len(idx) < min_n or (gold and right[idx[0]] is None):
            continue
        v, n = value(idx), len(idx)
        rows[idx] = (v / n, 1.0 / n)
        counted = True
    return rows if counted else None


@additive_metric(
    "exact_match",
    combine=ratio,
    description="Accuracy: the share of generations whose answer (read by the sweep's task: section) is one of "
    "its prompt's gold answers, over the prompts that have one.",
    level="sequence",
    higher_is_better=True,
    needs_answers=True,
    unit_interval=True,
    outcomes=True,  # one right-or-wrong answer a generation: several a prompt, Korn and Graubard's interval
    citation="lm-evaluation-harness's exact_match after its filters",
)
def exact_match(cell: CellData) -> np.ndarray | None:
    seen = judged(cell)
    if seen is None or all(r is None for r in seen[1]):
        return None
    return item_rows([(0.0, 0.0) if r is None else (float(r), 1.0) for r in seen[1]], 2)


@additive_metric(
    "answered",
    combine=ratio,
    description="The share of generations from which the task's filters could read an answer.",
    level="sequence",
    higher_is_better=True,
    unit_interval=True,
)
def answered(cell: CellData) -> np.ndarray | None:
    seen = judged(cell)
    return None if seen is None else item_rows([(float(a is not None), 1.0) for a in seen[0]], 2)


@additive_metric(
    "distinct_answers",
    combine=ratio,
    description="Distinct answers over a prompt's generations (1/n: all agree; 1: all differ), averaged over the "
    "prompts with two or more generations.",
    level="corpus",
    higher_is_better=None,
    unit_interval=True,
    per_prompt=True,
)
def distinct_answers(cell: CellData) -> np.ndarray | None:
    seen = judged(cell)
    if seen is None:
        return None
    answers = seen[0]
    return per_prompt(cell, lambda idx: len({answers[i] for i in idx} - {None}) / len(idx), min_n=2, gold=False)


def _pass_at(k: int) -> Metric:
    def per_item(cell: CellData) -> np.ndarray | None:
        seen = judged(cell)
        right = seen[1] if seen is not None else []
        return per_prompt(cell, lambda idx: pass_at_k(len(idx), sum(bool(right[i]) for i in idx), k), min_n=k)

    description = (f"The chance that at least one of {k} generations of a prompt is right (unbiased estimator from "
                   f"all n >= {k} generations of each prompt).")  # fmt: skip
    return _accuracy(f"pass@{k}", description, per_item, CHEN, outcomes=k == 1)  # pass@1: c / n, exact_match's share


def _accuracy(name: str, description: str, per_item, citation: str, outcomes: bool = False) -> Metric:
    """A family member: an accuracy (a share, higher is better) of per-prompt values over the prompts' answers;
    `outcomes`: its value a prompt is the share of its right answers (pass@1), so its interval is exact_match's."""
    return Metric(name=name, description=description, level="corpus", higher_is_better=True, needs_answers=True,
                  per_item=per_item, combine=ratio, unit_interval=True, per_prompt=True, outcomes=outcomes,
                  citation=citation)  # fmt: skip


def _maj_at(k: int) -> Metric:
    def per_item(cell: CellData) -> np.ndarray | None:
        seen = judged(cell)
        if seen is None:
            return None
        answers, right = seen
        seeds = cell.seeds if len(cell.seeds) == len(cell.texts) else [None] * len(cell.texts)

        def vote(idx: list[int]) -> float:
            first = sorted(idx, key=lambda i: (seeds[i] is None, seeds[i] or 0, i))[:k]
            winner = majority([answers[i] for i in first])
            return float(winner is not None and right[idx[0]] is not None and _agrees(answers, right, idx, winner))

        return per_prompt(cell, vote, min_n=k)

    description = (f"Self-consistency: the majority answer of {k} generations of a prompt (the {k} smallest seeds; a "
                   "tie goes to the first answer in code-point order) is right.")  # fmt: skip
    return _accuracy(f"maj@{k}", description, per_item, WANG)


def _agrees(answers: Sequence[str | None], right: Sequence[bool | None], idx: list[int], winner: str) -> bool:
    """Whether the answer `winner` is right for the prompt of `idx` (judged where a generation gave it)."""
    return any(answers[i] == winner and right[i] for i in idx)


METRICS.family("pass", _pass_at, f"pass@k: at least one of k generations is right ({CHEN})")
METRICS.family("maj", _maj_at, f"maj@k: the majority answer of k generations is right ({WANG})")
