"""Repetition within generations: rep-2, rep-3, rep-4 and diversity (Su et al. 2022).

    rep-n     = 1 − Σ_i |unique n-grams of generation i| / Σ_i |n-grams of generation i|
    diversity = Π_{n=2..4} (1 − rep-n)

as in SimCTG's `measure_repetition_and_diversity` (Su et al. 2022, "A Contrastive
Framework for Neural Text Generation"; rep-n after Welleck et al. 2019, "Neural Text
Generation with Unlikelihood Training"). Uniqueness is within each generation: an
n-gram repeated across two generations is not a repetition. Deviations from the
SimCTG code, all deliberate:

- tokens come from `word_tokenize` (SimCTG splits on white space);
- every n-gram counts: a generation of L words has L − n + 1 n-grams (SimCTG's loop
  `while end_idx < len(token_list)` drops the last one);
- values are fractions in [0, 1], not rounded (SimCTG rounds rep-n to two decimals of
  a percentage before taking the product).

rep-n is None when the cell has no n-gram at all (every generation shorter than n
words); diversity is None when any of its rep-n is.
"""

from __future__ import annotations

from controller.metrics import CellData, metric
from controller.metrics.tokenize import ngrams

_SU = 'Su et al. 2022, "A Contrastive Framework for Neural Text Generation" (SimCTG), NeurIPS'
_WELLECK = 'Welleck et al. 2020, "Neural Text Generation with Unlikelihood Training", ICLR'


def rep_n(docs: list[list[str]], n: int) -> float | None:
    """1 − (Σ per-generation unique n-grams) / (Σ per-generation n-grams); None if no n-grams."""
    unique = total = 0
    for words in docs:
        grams = ngrams(words, n)
        unique += len(set(grams))
        total += len(grams)
    if total == 0:
        return None
    return 1.0 - unique / total


def _register(n: int) -> None:
    metric(
        f"rep_{n}",
        description=f"Share of {n}-grams that repeat an earlier {n}-gram of the same generation (pooled over the cell).",
        level="corpus",
        higher_is_better=False,
        citation=f"{_WELLECK}; {_SU}",
        unit="fraction",
    )(lambda cell: rep_n(cell.words, n))


for _n in (2, 3, 4):
    _register(_n)


@metric(
    "diversity",
    description="(1 − rep-2)(1 − rep-3)(1 − rep-4): 1 when no generation repeats itself.",
    level="corpus",
    higher_is_better=True,
    citation=_SU,
    unit="fraction",
)
def diversity(cell: CellData) -> float | None:
    """Π_{n=2..4} (1 − rep-n); None when any rep-n is None."""
    product = 1.0
    for n in (2, 3, 4):
        rep = rep_n(cell.words, n)
        if rep is None:
            return None
        product *= 1.0 - rep
    return product
