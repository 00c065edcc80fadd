"""What a cell contributes to paired comparisons, and how two cells line up (controller.report.stats.paired).

A cell's statistics (`CellStats`) are its values, the per-prompt statistics its intervals kept (an additive
metric's sums, a plain corpus metric's leave-one-out values), the items its swap tests need and each prompt's
number of generations. Where a prompt has more than one, they also hold the same statistics of each prompt's
first generation (`CellStats.firsts`) for the plain corpus metrics (distinct-n, self-BLEU, Zipf, a plugin's):
such a metric is a function of the whole set of generations, so its value moves with how many there are
(distinct-n falls as a cell grows; a generation's self-BLEU has more references, its own prompt's other
generations among them), and a cell of 3 generations a prompt compared with a baseline of 1 would show that as a
difference. `matched` gives both cells' firsts where the generations a prompt differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from controller.metrics import CountItems, OverlapItems, UnionItems


@dataclass
class CellStats:
    """What a cell contributes to comparisons: its key, model, strategy, values and kept statistics."""

    cell: str
    model: str
    strategy: str
    prompts: list[str]
    values: dict[str, float]
    kept: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    items: dict[str, UnionItems | OverlapItems | CountItems] = field(default_factory=dict)  # swap tests' (`swaps`)
    generations: list[int] = field(default_factory=list)  # each prompt's, in `prompts` order (empty: not known)
    firsts: CellStats | None = None  # the plain corpus metrics' of each prompt's first generation (several a prompt)

    def plain(self, name: str) -> bool:
        """Whether `name` is a plain corpus metric of this cell (its kept statistics leave-one-out values)."""
        return self.kept.get(name, ("",))[0] == "loo"


def common(a: CellStats, b: CellStats) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the prompts both cells have, in a's order: (in a, in b)."""
    pos_b = {p: i for i, p in enumerate(b.prompts)}
    pairs = [(i, pos_b[p]) for i, p in enumerate(a.prompts) if p in pos_b]
    ia, ib = (np.array(x, dtype=np.intp) for x in zip(*pairs)) if pairs else (np.empty(0, np.intp),) * 2
    return ia, ib


def align(a: CellStats, b: CellStats, name: str) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Both cells' kept statistics of `name` on their common prompts, in a's order, and those prompts' positions."""
    if name not in a.kept or name not in b.kept or a.kept[name][0] != b.kept[name][0]:
        return None
    kind = a.kept[name][0]
    ia, ib = common(a, b)
    if len(ia) < 2:
        return None
    if kind == "loo" and not (len(ia) == len(a.prompts) == len(b.prompts)):
        return None  # a leave-one-out value depends on the whole prompt set: compare only equal sets
    return kind, a.kept[name][1][ia], b.kept[name][1][ib], ia, ib


def generations(a: CellStats, b: CellStats, ia: np.ndarray, ib: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Both cells' generations of each common prompt, in a's order; None where a cell does not know its own."""
    if len(a.generations) != len(a.prompts) or len(b.generations) != len(b.prompts):
        return None
    return np.asarray(a.generations)[ia], np.asarray(b.generations)[ib]


def matched(a: CellStats, b: CellStats) -> tuple[CellStats | None, CellStats | None] | None:
    """Both cells' statistics of each prompt's first generation where their generations of a common prompt differ
    (a cell with one a prompt is its own; None for a cell that kept none), for the plain corpus metrics; None
    where the generations are alike (or not known), and every metric compares the cells as they are."""
    ia, ib = common(a, b)
    counts = generations(a, b, ia, ib)
    if counts is None or np.array_equal(*counts):
        return None
    return tuple(c if all(k == 1 for k in c.generations) else c.firsts for c in (a, b))  # type: ignore[return-value]
