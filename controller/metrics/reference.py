"""Reference-based metrics: BLEU (sacrebleu) and ROUGE-1/2/L (rouge-score).

Both libraries are used as they are, through their public API and with their own
tokenisation, so the values compare with published numbers; nothing here re-implements
BLEU or ROUGE. Both are additive (see `controller.metrics`):

- `bleu`: each generation with a reference contributes sacrebleu's sufficient
  statistics, `BLEU().sentence_score(text, [reference])`'s `sys_len`, `ref_len`,
  `counts` and `totals`; the cell's sums are scored with sacrebleu's own
  `BLEU.compute_bleu`, which is exactly `sacrebleu.corpus_bleu(texts, [references])`
  with sacrebleu's defaults (13a tokenizer, mixed case, exponential smoothing, one
  reference per generation); 0-100 as sacrebleu reports it. `bleu_signature()` gives
  the exact signature.
- `rouge_1`, `rouge_2`, `rouge_l`: `rouge_scorer.RougeScorer(["rouge1", "rouge2",
  "rougeL"], use_stemmer=True)`, F-measure of each (reference, generation) pair, mean
  over pairs; 0-1. Porter stemming as in the original ROUGE-1.5.5 `-m` setting used
  by most summarisation papers. rouge-score's tokenizer lowercases and keeps only
  [a-z0-9] runs: text in other scripts scores 0.

Only the generations whose prompt has a reference take part (the others contribute
zeros); None when none has. The libraries are imported on first use, so importing the
registry stays light.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.registry import additive_metric, item_rows, ratio

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
ROUGE_USE_STEMMER = True
_SACREBLEU = 'Post 2018, "A Call for Clarity in Reporting BLEU Scores", WMT (sacrebleu); Papineni et al. 2002, ACL'
_ROUGE = 'Lin 2004, "ROUGE: A Package for Automatic Evaluation of Summaries" (rouge-score implementation)'


def _references(cell: CellData) -> list[str | None]:
    """One reference (or None) per generation."""
    return cell.references if len(cell.references) == len(cell.texts) else [None] * len(cell.texts)


def _bleu_object():
    from sacrebleu.metrics import BLEU

    return BLEU()  # defaults: tokenize="13a", lowercase=False, smooth_method="exp"


@lru_cache(maxsize=1)
def _bleu_scorers():
    """(corpus scorer, sentence statistics extractor), both with sacrebleu's defaults.

    `effective_order` changes only a sentence's own score, never its statistics; setting
    it on the extractor silences sacrebleu's advice to use it for sentence-level BLEU.
    """
    from sacrebleu.metrics import BLEU

    return _bleu_object(), BLEU(effective_order=True)


def bleu_signature() -> str:
    """The sacrebleu signature of `bleu`, e.g. 'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0'."""
    scorer = _bleu_object()
    scorer.corpus_score(["a"], [["a"]])  # sacrebleu knows nrefs only after scoring
    return str(scorer.get_signature())


def _bleu_value(sums: Sequence[float]) -> float | None:
    """sacrebleu's corpus BLEU from the summed [pairs, sys_len, ref_len, counts..., totals...].

    The counts are not rounded: a report's delta-method SE takes BLEU's numerical gradient, a step of
    1e-6 a count, which rounding turned into a gradient of 0 (every BLEU interval was [θ, θ]). sacrebleu
    formats the lengths as integers, so its brevity penalty is applied here, by its own formula, to its
    score at equal lengths: bp · (1.0 · exp(…)) is bit for bit its bp · exp(…) wherever the sums are counts."""
    if sums[0] == 0:
        return None
    scorer, _ = _bleu_scorers()
    k = scorer.max_ngram_order
    sys_len, ref_len = max(0.0, float(sums[1])), max(0.0, float(sums[2]))
    bp = 1.0
    if sys_len < ref_len:
        bp = math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0
    counts = [max(0.0, float(x)) for x in sums[3:]]  # a gradient's step below a count of 0 is 0
    unpenalised = scorer.compute_bleu(
        correct=counts[:k],
        total=counts[k:],
        sys_len=1,
        ref_len=1,
        smooth_method=scorer.smooth_method,
        smooth_value=scorer.smooth_value,
        effective_order=scorer.effective_order,
        max_ngram_order=k,
    ).score
    return float(bp * unpenalised)


@additive_metric(
    "bleu",
    combine=_bleu_value,
    description="sacrebleu corpus BLEU of the generations against their prompts' references (13a, 0-100).",
    level="corpus",
    higher_is_better=True,
    needs_references=True,
    # the studentised bootstrap, not sacrebleu's percentile one (its --confidence): on skewed populations the
    # percentile interval covered 85 / 91% at 16 / 32 prompts, and 56 / 66% where 4-gram matches are few
    # (benchmarks/bench_coverage.py, docs/reports.md#confidence-intervals)
    citation=_SACREBLEU,
    unit="BLEU (0-100)",
    bounds=(0, 100),
)
def bleu(cell: CellData) -> np.ndarray:
    """Per generation [1, sys_len, ref_len, counts_1..4, totals_1..4] against its reference; zeros without one."""
    _, sentence = _bleu_scorers()
    width = 3 + 2 * sentence.max_ngram_order
    rows = []
    for text, ref in zip(cell.texts, _references(cell)):
        if ref is None:
            rows.append([0] * width)
            continue
        s = sentence.sentence_score(text, [ref])
        rows.append([1, s.sys_len, s.ref_len, *s.counts, *s.totals])
    return item_rows(rows, width)


@lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=ROUGE_USE_STEMMER)


@lru_cache(maxsize=8)
def _rouge_f(texts: tuple[str, ...], refs: tuple[str | None, ...]) -> dict[str, list[float | None]]:
    """Per generation, each ROUGE type's F-measure (None without a reference).

    Cached: the three ROUGE metrics, and their intervals, share one scorer pass.
    """
    scorer = _rouge_scorer()
    scores = [
        scorer.score(ref, text) if ref is not None else None  # score(target, prediction)
        for text, ref in zip(texts, refs)
    ]
    return {t: [s[t].fmeasure if s is not None else None for s in scores] for t in ROUGE_TYPES}


def _rouge_stats(cell: CellData, rouge_type: str) -> np.ndarray:
    """Per generation [F, 1] where it has a reference, [0, 0] otherwise: the value is the mean F over pairs."""
    fs = _rouge_f(tuple(cell.texts), tuple(_references(cell)))[rouge_type]
    return item_rows([(f, 1) if f is not None else (0, 0) for f in fs], 2)


def _register_rouge(name: str, rouge_type: str, what: str) -> None:
    additive_metric(
        name,
        combine=ratio,
        description=f"Mean {what} F-measure (rouge-score, Porter stemmer) of generation vs. reference.",
        level="corpus",
        higher_is_better=True,
        needs_references=True,
        citation=_ROUGE,
        unit="F1 (0-1)",
        unit_interval=True,  # a mean of F-measures in [0, 1], one a generation
    )(lambda cell: _rouge_stats(cell, rouge_type))


_register_rouge("rouge_1", "rouge1", "ROUGE-1 (unigram)")
_register_rouge("rouge_2", "rouge2", "ROUGE-2 (bigram)")
_register_rouge("rouge_l", "rougeL", "ROUGE-L (longest common subsequence)")
