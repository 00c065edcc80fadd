"""MAUVE (Pillutla et al. 2021): how close the generations' distribution is to the references'.

Computed with mauve-text's `compute_mauve(p_features=..., q_features=...)` from features the
worker stored with each generation (worker.engine.features): p = the features of prompt +
generated text, one per generation (the cell's sample: `sample`), q = the features of prompt +
reference, one per prompt (each reference once, however many generations its prompt has, as in
the paper; docs/metrics.md#mauve). The features are the sweep-wide `featurizer`'s
final hidden state at the last token of the text cut to `featurizer_max_tokens` tokens;
both are recorded in each job (result.json: job and provenance.featurizer).

The settings below are fixed and listed in the metric's description, beside the value: a
value is comparable with another only under the same featurizer, max length and settings.
Empty (None) unless every generation has its features and at least two have a reference's.
Interval: none (MAUVE's quantisation depends on the sample size, so halves of the prompts
estimate a different quantity; see docs/metrics.md). `mauve` is imported only when a value is
computed (it imports torch only where torch is installed, i.e. never in the controller image).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.registry import metric

# mauve-text's defaults, passed explicitly so that a change of the library's defaults cannot move a value.
MAUVE_SETTINGS: dict[str, Any] = {
    "num_buckets": "auto",  # k-means clusters: max(2, round(min(|p|, |q|) / 10))
    "pca_max_data": -1,
    "kmeans_explained_var": 0.9,
    "kmeans_num_redo": 5,
    "kmeans_max_iter": 500,
    "divergence_curve_discretization_size": 25,
    "mauve_scaling_factor": 5,
    "seed": 25,
}
MIN_ITEMS = 2


def settings_text() -> str:
    """The settings as one line, e.g. for the metric's description."""
    return ", ".join(f"{k}={v}" for k, v in MAUVE_SETTINGS.items())


def sample(cell: CellData) -> list[int]:
    """The generations MAUVE compares: all, or `cell.sample_size` of them drawn with `cell.sample_seed`.

    Every cell of a report is compared on the same number of generations (the smallest cell's),
    as MAUVE's quantisation depends on the sample size."""
    n = len(cell.texts)
    if cell.sample_size is None or cell.sample_size >= n:
        return list(range(n))
    rng = np.random.default_rng(cell.sample_seed)
    return sorted(rng.choice(n, size=cell.sample_size, replace=False).tolist())


def mauve_features(cell: CellData) -> tuple[np.ndarray, np.ndarray] | None:
    """(p, q): the sampled generations' features, the references' (each prompt once); None if MAUVE cannot apply."""
    n = len(cell.texts)
    if n < MIN_ITEMS or len(cell.features) != n or any(f is None for f in cell.features):
        return None
    ids = cell.prompt_ids if len(cell.prompt_ids) == n else [None] * n
    refs, seen = [], set()
    for pid, f in zip(ids, cell.reference_features or [None] * n):
        if f is None or (pid is not None and pid in seen):
            continue
        seen.add(pid)
        refs.append(f)
    if len(refs) < MIN_ITEMS:
        return None
    chosen = sample(cell)
    return np.asarray([cell.features[i] for i in chosen], dtype=np.float32), np.asarray(refs, dtype=np.float32)


def sizes(cell: CellData) -> tuple[int, int, int] | None:
    """(generations, references, k-means clusters) MAUVE uses on the cell; None where it does not apply."""
    pq = mauve_features(cell)
    if pq is None:
        return None
    n_p, n_q = len(pq[0]), len(pq[1])
    return n_p, n_q, max(2, int(round(min(n_p, n_q) / 10)))  # mauve-text's num_buckets="auto"


def compute(p: np.ndarray, q: np.ndarray) -> float:
    """MAUVE of p against q with the recorded settings."""
    import mauve

    return float(mauve.compute_mauve(p_features=p, q_features=q, verbose=False, **MAUVE_SETTINGS).mauve)


@metric(
    "mauve",
    description="MAUVE of the generations (prompt + text) against the references (prompt + reference), from the "
    "sweep's featurizer's last-token hidden states; comparable only under the same featurizer, max length and "
    f"settings ({settings_text()}).",
    level="corpus",
    higher_is_better=True,
    needs_references=True,
    needs_model=True,
    worker_computes="featurize",
    interval="none",
    bounds=(0, 1),
    citation="Pillutla et al. 2021, NeurIPS (arXiv:2102.01454); published numbers: gpt2-large features",
)
def mauve_value(cell: CellData) -> float | None:
    """MAUVE in (0, 1]; None without the features (no featurizer, or a generation lacks its features)."""
    pq = mauve_features(cell)
    return None if pq is None else compute(*pq)
