"""Reference-based metrics: BLEU (sacrebleu) and ROUGE-1/2/L (rouge-score).

Both libraries are used as they are, with their own tokenisation, so the values compare
with published numbers; nothing here re-implements BLEU or ROUGE.

- `bleu`: `sacrebleu.corpus_bleu(texts, [references])` with sacrebleu's defaults
  (13a tokenizer, mixed case, exponential smoothing, one reference per generation);
  0-100 as sacrebleu reports it. `bleu_signature()` gives the exact signature.
- `rouge_1`, `rouge_2`, `rouge_l`: `rouge_scorer.RougeScorer(["rouge1", "rouge2",
  "rougeL"], use_stemmer=True)`, F-measure of each (reference, generation) pair, mean
  over pairs; 0-1. Porter stemming as in the original ROUGE-1.5.5 `-m` setting used
  by most summarisation papers. rouge-score's tokenizer lowercases and keeps only
  [a-z0-9] runs: text in other scripts scores 0.

Only the generations whose prompt has a reference take part; None when none has.
The libraries are imported on first use, so importing the registry stays light.
"""

from __future__ import annotations

import math
from functools import lru_cache

from controller.metrics import CellData, metric

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
ROUGE_USE_STEMMER = True
_SACREBLEU = 'Post 2018, "A Call for Clarity in Reporting BLEU Scores", WMT (sacrebleu); Papineni et al. 2002, ACL'
_ROUGE = 'Lin 2004, "ROUGE: A Package for Automatic Evaluation of Summaries" (rouge-score implementation)'


def _pairs(cell: CellData) -> tuple[list[str], list[str]]:
    """(generations, references) of the generations that have a reference."""
    hyps, refs = [], []
    for text, ref in zip(cell.texts, cell.references):
        if ref is not None:
            hyps.append(text)
            refs.append(ref)
    return hyps, refs


def _bleu_object():
    from sacrebleu.metrics import BLEU

    return BLEU()  # defaults: tokenize="13a", lowercase=False, smooth_method="exp"


def bleu_signature() -> str:
    """The sacrebleu signature of `bleu`, e.g. 'nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0'."""
    scorer = _bleu_object()
    scorer.corpus_score(["a"], [["a"]])  # sacrebleu knows nrefs only after scoring
    return str(scorer.get_signature())


@metric(
    "bleu",
    description="sacrebleu corpus BLEU of the generations against their prompts' references (13a, 0-100).",
    level="corpus",
    higher_is_better=True,
    needs_references=True,
    citation=_SACREBLEU,
    unit="BLEU (0-100)",
)
def bleu(cell: CellData) -> float | None:
    """Corpus BLEU over (generation, reference) pairs; None without references."""
    hyps, refs = _pairs(cell)
    if not hyps:
        return None
    return float(_bleu_object().corpus_score(hyps, [refs]).score)


@lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=ROUGE_USE_STEMMER)


@lru_cache(maxsize=8)
def _rouge_means(hyps: tuple[str, ...], refs: tuple[str, ...]) -> dict[str, float]:
    """Mean F-measure per ROUGE type over the pairs (cached: the three metrics share one pass)."""
    scorer = _rouge_scorer()
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(hyps, refs)]  # score(target, prediction)
    return {t: math.fsum(s[t].fmeasure for s in scores) / len(scores) for t in ROUGE_TYPES}


def _rouge(cell: CellData, rouge_type: str) -> float | None:
    hyps, refs = _pairs(cell)
    if not hyps:
        return None
    return _rouge_means(tuple(hyps), tuple(refs))[rouge_type]


def _rouge_metric(name: str, what: str):
    return metric(
        name,
        description=f"Mean {what} F-measure (rouge-score, Porter stemmer) of generation vs. reference.",
        level="corpus",
        higher_is_better=True,
        needs_references=True,
        citation=_ROUGE,
        unit="F1 (0-1)",
    )


@_rouge_metric("rouge_1", "ROUGE-1 (unigram)")
def rouge_1(cell: CellData) -> float | None:
    """Mean ROUGE-1 F over pairs; None without references."""
    return _rouge(cell, "rouge1")


@_rouge_metric("rouge_2", "ROUGE-2 (bigram)")
def rouge_2(cell: CellData) -> float | None:
    """Mean ROUGE-2 F over pairs; None without references."""
    return _rouge(cell, "rouge2")


@_rouge_metric("rouge_l", "ROUGE-L (longest common subsequence)")
def rouge_l(cell: CellData) -> float | None:
    """Mean ROUGE-L F over pairs; None without references."""
    return _rouge(cell, "rougeL")
