"""A paired comparison's statistic with prompts swapped between its two cells, for the permutation test.

Under "no difference" (and common random numbers) the two cells' generations of a prompt are exchangeable,
so a prompt's can be swapped between the cells: the permutation test (controller.report.stats.paired)
recomputes the statistic, metric(a) − metric(b), on arrangements of swaps. Each function here returns that
statistic as a function of `swapped`, a boolean array (..., G) (True: prompt i's generations swapped),
computed in batches of at most BATCH numbers:

- `additive`: a metric of summed per-generation statistics, from each prompt's sums (per generation where the
  cells' generations a prompt differ, 3 seeds against 1: not an exchange of like with like otherwise);
- `union`: a union metric (distinct-n: |∪ items| / Σ totals) from each prompt's distinct items
  (controller.metrics.unions), recomputed exactly: the metric itself, not a linear stand-in such as its
  jackknife pseudo-values, whose t-test is conservative for distinct-1 and distinct-3 (docs/reports.md);
- `self_bleu`: self-BLEU from each generation's n-gram occurrences (controller.metrics.overlaps), recomputed
  on each arrangement (every generation's clipped counts and closest reference length in its cell), where the
  jackknife t-test was conservative (1.4-3.2% under a true null);
- `zipf`: the Zipf coefficient from each prompt's word counts (controller.metrics.counts): a cell's counts after
  the swaps are sums of its prompts', refitted on each arrangement (the jackknife t-test rejected a true null in
  2.5-4.6%);
- `of_items`: the one of these that a metric's kept items call for.

For a union metric an item is in cell a after the swaps unless every prompt whose a-side holds it is swapped
and every prompt whose b-side holds it is not: with M the swaps (K × G), D_A and D_B the prompts × items
incidences, item c is missing from a where deg_A(c) − (M·D_A)(c) + (M·D_B)(c) = 0. Items that both sides of one
prompt hold are in both cells whatever the swaps, and items held once are linear in the swaps, so only the
items that several prompts hold take part in the product.

Self-BLEU's clipped counts are the same count one generation at a time: generation h's occurrence item c is clipped
in (counted) where another generation of h's cell holds c, i.e. where c's count in that cell, deg_A(c) − (M·D_A)(c)
+ (M·D_B)(c) for cell a, is at least 2 (h is one). An occurrence that another generation of h's own prompt and side
holds is counted whatever the swaps. The closest reference length is the same count over the generations of each
length, taken in the order of closeness to h's length until one other than h is in h's cell.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import sparse

from controller.metrics import CountItems, OverlapItems, UnionItems
from controller.report.stats.bootstrap_t import values_of

BATCH = 1 << 22  # numbers held at once (32 MiB of float64)

SCALE_PROBE = 7.0  # any factor but 1: combine(sums / SCALE_PROBE) == combine(sums) tells a scale-invariant metric
Statistic = Callable[[np.ndarray], np.ndarray]


def _batched(G: int, width: int, one: Callable[[np.ndarray], np.ndarray]) -> Statistic:
    step = max(1, BATCH // max(1, width))

    def statistic(swapped: np.ndarray) -> np.ndarray:
        flat = np.asarray(swapped, dtype=bool).reshape(-1, G)
        out = np.empty(len(flat))
        with np.errstate(invalid="ignore", divide="ignore"):
            for i in range(0, len(flat), step):
                out[i : i + step] = one(flat[i : i + step])
        return out.reshape(np.shape(swapped)[:-1])

    return statistic


def additive(
    sums_a: np.ndarray, sums_b: np.ndarray, combine: Callable, generations: tuple[np.ndarray, np.ndarray] | None = None
) -> Statistic:
    """f(Σ a) − f(Σ b) of per-prompt sums (G, k) with the swapped prompts' rows exchanged.

    `generations`: each prompt's generations in a and in b. Where they differ (8 samples against greedy's one,
    3 seeds against 1), a swap would move a block of 8 into b and 1 into a, reweighting the prompts, so the swaps'
    spread would hold how much prompts differ from each other, not only what the cells do: the test rejected a
    true null in 0.0-0.8% of simulations at 3 v 1 and 8 v 1 on the skewed benchmark process (docs/reports.md;
    per generation 4.4-6.4% on both processes). There each prompt's sums are taken per generation (divided by
    its generations), which for a metric whose `combine` does not change when every sum is scaled alike (a
    ratio, BLEU; checked here on the pair's sums, else the sums stay as they are) leaves each cell's value as it
    is where a cell has the same generations for every prompt, and makes a swap exchange like with like."""
    f = values_of(combine)
    if generations is not None and not np.array_equal(*generations):
        per_a, per_b = (
            sums / np.maximum(np.asarray(k, dtype=float), 1)[:, None] for sums, k in zip((sums_a, sums_b), generations)
        )
        total = np.concatenate([sums_a, sums_b]).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            scaled = f(np.stack([total, total / SCALE_PROBE]))
        if np.isfinite(scaled).all() and np.isclose(scaled[0], scaled[1], rtol=1e-9, atol=1e-12):
            sums_a, sums_b = per_a, per_b

    def one(m: np.ndarray) -> np.ndarray:
        m = m[:, :, None]
        return f(np.where(m, sums_b, sums_a).sum(axis=1)) - f(np.where(m, sums_a, sums_b).sum(axis=1))

    return _batched(len(sums_a), sums_a.size, one)


def _holders_in_a(row: np.ndarray, prompt: np.ndarray, in_b: np.ndarray, items: int, G: int) -> Callable:
    """How many holders of each of `items` items are in cell a after the swaps, from every holding's item (`row`),
    prompt and side (`in_b`): deg_A + M·(D_B − D_A), a function of the swaps as floats (K, G) -> (K, items); and
    each item's holders in all."""
    diff = sparse.csr_matrix((np.where(in_b, 1.0, -1.0), (row, prompt)), shape=(items, G))  # +D_B − D_A
    deg_a = np.bincount(row, weights=~in_b, minlength=items)
    return lambda mf: deg_a + np.asarray((diff @ mf.T).T), np.bincount(row, minlength=items).astype(float)


def union(a: UnionItems, b: UnionItems) -> Statistic:
    """|∪ a| / Σ a − |∪ b| / Σ b of two cells' union items on the same G prompts, with the swapped prompts'
    items and totals exchanged."""
    G = a.groups
    if b.groups != G:
        raise ValueError(f"swapping prompts needs the same prompts in both cells: {G} and {b.groups}")
    items = np.concatenate([a.items, b.items])
    side = np.concatenate([np.zeros(len(a.items), bool), np.ones(len(b.items), bool)])
    rows = np.concatenate([a.group_of_items(), b.group_of_items()])
    _, col = np.unique(items, return_inverse=True)
    col = col.ravel()
    # items some prompt holds on both sides: in both cells, whatever the swaps
    key = col.astype(np.int64) * G + rows
    both = np.intersect1d(key[~side], key[side])
    always = np.zeros(col.max() + 1 if len(col) else 0, bool)
    always[both // G] = True
    held = np.bincount(col, minlength=len(always))
    once = ~always[col] & (held[col] == 1)  # one prompt on one side: in a unless it is swapped (or in b if swapped)
    single_a = np.bincount(rows[once & ~side], minlength=G).astype(float)
    single_b = np.bincount(rows[once & side], minlength=G).astype(float)
    shared = ~always[col] & (held[col] > 1)
    cols, sc = np.unique(col[shared], return_inverse=True)
    count_a, held_shared = _holders_in_a(sc.ravel(), rows[shared], side[shared], len(cols), G)
    fixed = float(np.count_nonzero(always))
    base_a, base_b = fixed + single_a.sum(), fixed + single_b.sum()  # in a and b with no prompt swapped, but shared
    total_a, total_b = float(a.totals.sum()), float(b.totals.sum())
    moved_total, moved_single = b.totals - a.totals, single_b - single_a

    def one(m: np.ndarray) -> np.ndarray:
        mf = m.astype(float)
        holders_a = count_a(mf)  # (K, C)
        in_a = base_a + mf @ moved_single + np.count_nonzero(holders_a > 0.5, axis=1)
        in_b = base_b - mf @ moved_single + np.count_nonzero(held_shared - holders_a > 0.5, axis=1)
        tot = mf @ moved_total
        return in_a / (total_a + tot) - in_b / (total_b - tot)

    return _batched(G, max(1, len(cols)), one)


def self_bleu(a: OverlapItems, b: OverlapItems) -> Statistic | None:
    """Self-BLEU(a) − self-BLEU(b) of two cells' n-gram occurrences on the same G prompts, with the swapped
    prompts' generations exchanged; None where a prompt has different generations in the two cells (a swap would
    change both cells' sizes, which self-BLEU moves with: the jackknife t-test stays)."""
    G, max_n = a.groups, a.max_n
    if b.groups != G or b.max_n != max_n:
        raise ValueError(f"swapping prompts needs the same prompts and orders in both cells: {G} and {b.groups}")
    if not np.array_equal(a.sizes, b.sizes):
        return None
    n_gen = len(a.counts)
    prompt = np.concatenate([a.group_of_generations(), b.group_of_generations()])  # each generation's, a then b
    side = np.repeat([False, True], n_gen)  # True: b's
    counts = np.concatenate([a.counts, b.counts])
    slot_of = np.repeat(np.arange(2 * n_gen * max_n), counts.ravel())  # each item's (generation, order)
    holder = slot_of // max_n
    _, col = np.unique(np.concatenate([a.items, b.items]), return_inverse=True)
    col = col.ravel()
    unit = prompt[holder] * 2 + side[holder]  # (prompt, side): its generations are in one cell whatever the swaps
    _, in_unit, per_unit = np.unique(col.astype(np.int64) * (2 * G) + unit, return_inverse=True, return_counts=True)
    always = per_unit[in_unit.ravel()] >= 2  # another generation of the same prompt and side holds it
    held = np.bincount(col)
    swapped_in = ~always & (held[col] >= 2)  # counted or not as the swaps put its holders
    const = np.bincount(slot_of[always], minlength=2 * n_gen * max_n).reshape(2 * n_gen, max_n).astype(float)
    cols = np.unique(col[swapped_in])
    every = np.isin(col, cols)  # all the holders of those items count towards whether they are shared
    row = np.searchsorted(cols, col[every])
    count_a, deg = _holders_in_a(row, prompt[holder[every]], side[holder[every]], len(cols), G)
    own = sparse.csr_matrix(  # (slot, item): the items whose counting the swaps decide, by their (generation, order)
        (np.ones(int(swapped_in.sum())), (slot_of[swapped_in], np.searchsorted(cols, col[swapped_in]))),
        shape=(2 * n_gen * max_n, len(cols)),
    )
    reference = _closest_length(counts[:, 0], prompt, side, G)
    lengths, totals = counts[:, 0].astype(float), counts.astype(float)

    def one(m: np.ndarray) -> np.ndarray:
        mf = m.astype(float)
        in_a = m[:, prompt] == side  # (K, 2N): in cell a after the swaps
        holders_a = count_a(mf)
        own_a = np.asarray(own @ (holders_a >= 1.5).T.astype(float)).T  # (K, slots): counted in cell a
        own_b = np.asarray(own @ (deg - holders_a >= 1.5).T.astype(float)).T
        mine = np.repeat(in_a, max_n, axis=1)
        clipped = (const.ravel() + np.where(mine, own_a, own_b)).reshape(len(m), 2 * n_gen, max_n)
        scores = OverlapItems.scores(clipped, totals, lengths, reference(mf, in_a))
        size_a = in_a.sum(axis=1)
        return (scores * in_a).sum(axis=1) / size_a - (scores * ~in_a).sum(axis=1) / (2 * n_gen - size_a)

    return _batched(G, 8 * max(1, len(cols), 2 * n_gen * max_n), one)  # about 8 arrays of the widest at once


def _closest_length(lengths: np.ndarray, prompt: np.ndarray, side: np.ndarray, G: int) -> Callable:
    """NLTK's closest reference length of each generation (a's, then b's) in its cell after the swaps: `(swaps as
    floats, in_a) -> (K, generations)`. The cell's generations of each length are linear in the swaps; a
    generation's lengths are tried nearest first (ties: the shorter) until one other than itself is in its cell."""
    distinct, length_of = np.unique(lengths, return_inverse=True)
    length_of = length_of.ravel()
    per_prompt = np.zeros((2, G, len(distinct)))
    np.add.at(per_prompt, (side.astype(np.intp), prompt, length_of), 1.0)
    moved = per_prompt[1] - per_prompt[0]  # (G, lengths): +b − a
    in_a_unswapped, everywhere = per_prompt[0].sum(axis=0), per_prompt.sum(axis=(0, 1))
    gap = np.abs(distinct - lengths[:, None])
    closest = np.lexsort((np.broadcast_to(distinct, gap.shape), gap))

    def reference(mf: np.ndarray, in_a: np.ndarray) -> np.ndarray:
        of_length_a = in_a_unswapped + mf @ moved  # (K, lengths)
        ref = np.full(in_a.shape, -1.0)
        for depth in range(len(distinct)):
            d = closest[:, depth]
            there = np.where(in_a, of_length_a[:, d], everywhere[d] - of_length_a[:, d]) - (d == length_of)
            ref = np.where((ref < 0) & (there > 0.5), distinct[d].astype(float), ref)
            if (ref >= 0).all():
                break
        return ref

    return reference


def zipf(a: CountItems, b: CountItems) -> Statistic:
    """zipf(a) − zipf(b) of two cells' word counts on the same G prompts, with the swapped prompts' counts
    exchanged: cell a's count of word w is Σ over its unswapped prompts of a's counts plus over its swapped ones of
    b's, base_a + M · (C_b − C_a), and cell b's the rest of w's count in both."""
    G = a.groups
    if b.groups != G:
        raise ValueError(f"swapping prompts needs the same prompts in both cells: {G} and {b.groups}")
    side = np.concatenate([np.zeros(len(a.items), bool), np.ones(len(b.items), bool)])
    _, col = np.unique(np.concatenate([a.items, b.items]), return_inverse=True)
    col, counts = col.ravel(), np.concatenate([a.counts, b.counts]).astype(float)
    words = int(col.max()) + 1 if len(col) else 0
    prompt = np.concatenate([a.group_of_items(), b.group_of_items()])
    moved = sparse.csr_matrix((np.where(side, counts, -counts), (col, prompt)), shape=(words, G))  # C_b − C_a
    base_a = np.bincount(col, weights=np.where(side, 0.0, counts), minlength=words)
    total = np.bincount(col, weights=counts, minlength=words)

    def one(m: np.ndarray) -> np.ndarray:
        in_a = base_a + np.asarray((moved @ m.astype(float).T).T)  # (K, words)
        return CountItems.zipf(in_a) - CountItems.zipf(total - in_a)

    return _batched(G, 6 * max(1, words), one)


def of_items(a: UnionItems | OverlapItems | CountItems, b: UnionItems | OverlapItems | CountItems) -> Statistic | None:
    """The swap statistic of two cells' kept items (`union`, `self_bleu` or `zipf`); None where they allow none."""
    if isinstance(a, UnionItems) and isinstance(b, UnionItems):
        return union(a, b)
    if isinstance(a, OverlapItems) and isinstance(b, OverlapItems):
        return self_bleu(a, b)
    if isinstance(a, CountItems) and isinstance(b, CountItems):
        return zipf(a, b)
    raise TypeError(f"no swap statistic of {type(a).__name__} and {type(b).__name__}")
