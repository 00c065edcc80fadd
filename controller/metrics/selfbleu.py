"""Self-BLEU-4 (Zhu et al. 2018, Texygen), exact to NLTK and linear in the cell's size.

Each generation in turn is the hypothesis and all *other* generations of the cell are
its references; the score is NLTK's

    sentence_bleu(others, hyp, weights=(0.25,) * 4,
                  smoothing_function=SmoothingFunction().method1)

averaged over the generations, as Texygen's `SelfBleu` computes it (Texygen's fast
path also excludes the hypothesis itself; unlike Texygen we use every generation, not
a sample of 500, and `word_tokenize` instead of `nltk.word_tokenize`). Higher means
the generations resemble each other more: less diverse.

Doing that literally costs O(N²) re-tokenisation and n-gram counting. Here each
generation's n-grams are counted once; clipping needs, for each n-gram g of
hypothesis i, max_{j≠i} count_j(g), which is O(1) from the two largest counts of g
over the cell (and which generation holds the largest). The brevity penalty needs the
reference length closest to the hypothesis length among the others (ties: the shorter),
which is O(log N) from the sorted distinct lengths and their multiplicities. Every
floating-point step then follows NLTK's `corpus_bleu` operation by operation:

    p_n  = clipped_n / max(1, total_n)        (0.1 / max(1, total_n) when clipped_n = 0)
    bp   = 1 if c > r, 0 if c = 0, exp(1 − r / c) otherwise
    BLEU = 0 if clipped_1 = 0, else bp · exp(fsum(0.25 · log p_n for n = 1..4))

so each per-hypothesis value equals NLTK's bit for bit; the mean uses `math.fsum`, so it
does not depend on the order of the generations. None with fewer than 2 generations.

For its paired test the metric declares `swap_items`: each generation's n-gram occurrences as hashed items
(controller.metrics.overlaps), from which the report recomputes self-BLEU with prompts swapped between two cells.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.overlaps import EPSILON, overlap_items
from controller.metrics.registry import metric


def _ngram_keys(words: Sequence[str], n: int) -> list[str]:
    """The n-grams of `words` as space-joined strings.

    Tokens never contain white space, so joining is one-to-one. Strings (unlike tuples)
    are not tracked by the cyclic garbage collector, and neither are dicts holding only
    strings and ints: with tuple keys, a quarter of the time went to collector passes
    whose cost grew faster than the cell (measured at 1,000 and 4,000 generations).
    """
    if n == 1:
        return list(words)
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def _top2(counts: list[Counter]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """For each n-gram: its largest count, the index of a generation holding it, its second largest count."""
    first: dict[str, int] = {}
    holder: dict[str, int] = {}
    second: dict[str, int] = {}
    for i, counter in enumerate(counts):
        for gram, c in counter.items():
            top = first.get(gram)
            if top is None:
                first[gram] = c
                holder[gram] = i
                second[gram] = 0
            elif c > top:
                second[gram] = top
                first[gram] = c
                holder[gram] = i
            elif c > second[gram]:
                second[gram] = c
    return first, holder, second


def _closest_other_length(i: int, lengths: list[int], distinct: list[int], multiplicity: Counter) -> int:
    """NLTK's closest_ref_length over the lengths of every generation but i."""
    length = lengths[i]
    if multiplicity[length] >= 2:
        return length
    # `length` occurs once (generation i itself): its neighbours in the sorted distinct lengths.
    pos = bisect.bisect_left(distinct, length)
    candidates = []
    if pos > 0:
        candidates.append(distinct[pos - 1])
    if pos + 1 < len(distinct):
        candidates.append(distinct[pos + 1])
    return min(candidates, key=lambda r: (abs(r - length), r))


def self_bleu_scores(docs: Sequence[Sequence[str]], max_n: int = 4) -> list[float]:
    """Per-generation BLEU of each of `docs` against all the others (NLTK semantics, method1).

    Uniform weights 1/max_n over n = 1..max_n. Requires at least 2 documents, and tokens
    without spaces (n-grams are keyed by space-joined strings; `word_tokenize`'s tokens
    never contain white space).
    """
    k = len(docs)
    if k < 2:
        raise ValueError(f"self-BLEU needs at least 2 generations, got {k}")
    if any(" " in token for doc in docs for token in doc):
        raise ValueError("self-BLEU tokens must not contain spaces")
    weights = [1.0 / max_n] * max_n
    counts = [[Counter(_ngram_keys(doc, n)) for doc in docs] for n in range(1, max_n + 1)]
    best = [_top2(per_n) for per_n in counts]
    lengths = [len(doc) for doc in docs]
    distinct = sorted(set(lengths))
    multiplicity = Counter(lengths)

    scores = []
    for i in range(k):
        p_n = []
        for n_idx in range(max_n):
            hyp_counts = counts[n_idx][i]
            first, holder, second = best[n_idx]
            clipped = 0
            for gram, c in hyp_counts.items():
                other_max = second[gram] if holder[gram] == i else first[gram]
                clipped += c if c < other_max else other_max
            denominator = max(1, sum(hyp_counts.values()))
            p_n.append((clipped, denominator))
        scores.append(_score(p_n, lengths[i], _closest_other_length(i, lengths, distinct, multiplicity), weights))
    return scores


def _score(p_n: Sequence[tuple[int, int]], hyp_len: int, ref_len: int, weights: Sequence[float]) -> float:
    """NLTK's sentence BLEU from (clipped, total) per n, the hypothesis and closest reference lengths."""
    if p_n[0][0] == 0:  # NLTK returns 0 when no unigram matches
        return 0.0
    if hyp_len > ref_len:
        bp = 1.0
    elif hyp_len == 0:
        bp = 0.0
    else:
        bp = math.exp(1 - ref_len / hyp_len)
    logs = (w * math.log(num / den if num else (num + EPSILON) / den) for w, (num, den) in zip(weights, p_n))
    return bp * math.exp(math.fsum(logs))


def self_bleu(docs: Sequence[Sequence[str]], max_n: int = 4) -> float | None:
    """Mean self-BLEU-`max_n` of tokenised documents; None with fewer than 2."""
    if len(docs) < 2:
        return None
    scores = self_bleu_scores(docs, max_n)
    return math.fsum(scores) / len(scores)


def _top(counts: list[Counter], keep: int) -> dict[str, list[tuple[int, int]]]:
    """For each n-gram: its `keep` largest (count, generation) pairs, largest first (ties: the earlier)."""
    postings: dict[str, list[tuple[int, int]]] = {}
    for i, counter in enumerate(counts):
        for gram, c in counter.items():
            held = postings.get(gram)
            if held is None:
                postings[gram] = [(c, i)]  # most n-grams have one holder: nothing to sort
            else:
                held.append((c, i))
    for gram, pairs in postings.items():
        if len(pairs) > 1:
            postings[gram] = sorted(pairs, key=lambda p: -p[0])[:keep]
    return postings


def _closest_available(length: int, available: Counter) -> int:
    """NLTK's closest_ref_length over the lengths still available (count > 0); ties: the shorter."""
    return min((r for r, c in available.items() if c > 0), key=lambda r: (abs(r - length), r))


def _clip(top: list[tuple[int, int]], i: int, c: int, gone: set[int]) -> int:
    """min(c, the largest count in `top` (an n-gram's largest holders) of a document other than i, outside `gone`)."""
    for cj, j in top:
        if j != i and j not in gone:
            return c if c < cj else cj
    return 0


def _clipping_changes(counts: list[list[Counter]], tops: list[dict], gone: set[int]) -> dict[int, list[int]]:
    """Without the documents `gone`: {hypothesis: its change of clipped count per n} where any changes. Only the
    largest holder outside `gone` of one of their n-grams can change (every other keeps min(its count, the
    holder's count) = its count)."""
    delta: dict[int, list[int]] = {}
    for n, top in enumerate(tops):
        for gram in {g for i in gone for g in counts[n][i]}:
            a = next(((c, j) for c, j in top[gram] if j not in gone), None)
            if a is None:
                continue
            c_a, j_a = a
            change = _clip(top[gram], j_a, c_a, gone) - _clip(top[gram], j_a, c_a, set())
            if change:
                delta.setdefault(j_a, [0] * len(tops))[n] += change
    return delta


def _closest_lost(removed: Counter, multiplicity: Counter, by_ref: dict[int, list[int]], lengths: list[int]):
    """The hypotheses whose closest other length may have no document left once `removed` (length -> how many)
    are gone: where none of that length is left, or one, the hypothesis itself."""
    lost: set[int] = set()
    for length, c in removed.items():
        left = multiplicity[length] - c
        if left <= 1:
            lost.update(i for i in by_ref.get(length, ()) if left == 0 or lengths[i] == length)
    return lost


def self_bleu_leave_one_out(docs: Sequence[Sequence[str]], groups: Sequence[Sequence[int]], max_n: int = 4):
    """Self-BLEU of `docs` without each group of documents in turn, exactly (NaN where < 2 are left).

    Equal to `self_bleu` of the remaining documents bit for bit (each per-document score, and the mean), at
    a cost that grows with the cell's n-grams, not with the groups times the documents: leaving group g out
    changes a remaining hypothesis a's clipped count of an n-gram only where a is the n-gram's largest holder
    outside g (`_clipping_changes`), so each n-gram of g needs its |g| + 2 largest holders; a brevity penalty
    changes only where every other document of the closest length is in g (`_closest_lost`). So a group costs
    its own n-grams and the few hypotheses it changes, and the mean is the exact sum of the cell's scores (a
    Fraction) less the group's and the changed ones' old scores plus their new ones, rounded once, as
    `math.fsum` of the remaining scores rounds it."""
    k = len(docs)
    weights = [1.0 / max_n] * max_n
    keep = max((len(g) for g in groups), default=0) + 2
    counts = [[Counter(_ngram_keys(doc, n)) for doc in docs] for n in range(1, max_n + 1)]
    tops = [_top(per_n, keep) for per_n in counts]
    lengths = [len(doc) for doc in docs]
    distinct, multiplicity = sorted(set(lengths)), Counter(lengths)
    ref = [_closest_other_length(i, lengths, distinct, multiplicity) for i in range(k)] if k >= 2 else []
    by_ref: dict[int, list[int]] = {}
    for i, r in enumerate(ref):
        by_ref.setdefault(r, []).append(i)
    den = [[max(1, sum(counts[n][i].values())) for n in range(max_n)] for i in range(k)]
    clipped = [[sum(_clip(tops[n][g], i, c, set()) for g, c in counts[n][i].items()) for n in range(max_n)]
               for i in range(k)]  # fmt: skip
    exact = [Fraction(_score(list(zip(clipped[i], den[i])), lengths[i], ref[i], weights)) for i in range(k)]
    total = sum(exact, Fraction(0))
    out = np.full(len(groups), np.nan)
    for gi, members in enumerate(groups):
        gone = set(members)
        if k - len(gone) < 2:
            continue
        delta = _clipping_changes(counts, tops, gone)
        removed = Counter(lengths[i] for i in gone)
        changed = (set(delta) | _closest_lost(removed, multiplicity, by_ref, lengths)) - gone
        available = multiplicity - removed
        remaining = total - sum((exact[i] for i in gone), Fraction(0))
        for i in changed:
            available[lengths[i]] -= 1
            r = ref[i] if available[ref[i]] > 0 else _closest_available(lengths[i], available)
            available[lengths[i]] += 1
            if i in delta or r != ref[i]:
                d = delta.get(i, [0] * max_n)
                score = _score([(clipped[i][n] + d[n], den[i][n]) for n in range(max_n)], lengths[i], r, weights)
                remaining += Fraction(score) - exact[i]
        out[gi] = float(remaining) / (k - len(gone))
    return out


@metric(
    "self_bleu_4",
    description="Mean BLEU-4 of each generation against all other generations of the cell (NLTK method1 smoothing).",
    level="corpus",
    higher_is_better=False,
    interval="jackknife",  # a bootstrap's duplicated generation would match itself
    leave_one_out=lambda cell, groups: self_bleu_leave_one_out(cell.words, groups, 4),
    swap_items=lambda cell, groups, limit: overlap_items(cell.words, groups, 4, limit),
    unit_interval=True,
    jackknife_scale="linear",  # a mean of bounded scores, not a share of counts: docs/reports.md
    citation='Zhu et al. 2018, "Texygen: A Benchmarking Platform for Text Generation Models", SIGIR',
    unit="BLEU (0-1)",
)
def self_bleu_4(cell: CellData) -> float | None:
    """Self-BLEU-4 of the cell's generations; None with fewer than 2 generations."""
    return self_bleu(cell.words, 4)
