"""A cell's data, what every text metric sees: `CellData`, built from generation records by `cell_data`.

The metrics themselves and their registry are `controller.metrics.registry`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.metrics.tokenize import word_tokenize


@dataclass
class CellData:
    """Everything the text metrics of one cell (or the reference row) see.

    `words` is `texts` tokenised once with `controller.metrics.tokenize.word_tokenize`,
    the same fixed tokenizer for every cell. Lists are aligned: one entry per generation;
    an optional list that is empty (or holds None) means "absent", and the metrics that
    need it are empty. Build it with `cell_data(records)`.
    """

    texts: list[str]
    words: list[list[str]]
    references: list[str | None] = field(default_factory=list)
    n_new_tokens: list[int] = field(default_factory=list)
    stop_reasons: list[str] = field(default_factory=list)
    nll_sum: list[float | None] = field(default_factory=list)
    nll_count: list[int | None] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    features: list[list[float] | None] = field(default_factory=list)
    reference_features: list[list[float] | None] = field(default_factory=list)
    prompt_ids: list[str | None] = field(default_factory=list)
    # a task's data (controller.metrics.answers): each generation's prompt's gold answers and choices (None: none),
    # its own seed; `task` is the sweep's `task:` section (set by the report; None: the default extraction)
    answers: list[list[str] | None] = field(default_factory=list)
    choices: list[list[str] | None] = field(default_factory=list)
    seeds: list[int | None] = field(default_factory=list)
    task: dict | None = None
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # what a metric computed once for the cell
    # A metric compared across cells on equal samples (MAUVE) subsamples the cell to `sample_size`
    # generations with `sample_seed` (set by the report: the smallest cell's size); None: all.
    sample_size: int | None = None
    sample_seed: int = 0

    def subset(self, idx: Sequence[int] | np.ndarray) -> CellData:
        """The cell restricted to the generations `idx`, in that order (repetitions allowed)."""

        def pick(values: list) -> list:
            return [values[i] for i in idx] if len(values) == len(self.texts) else []

        return CellData(
            texts=pick(self.texts),
            words=pick(self.words),
            references=pick(self.references),
            n_new_tokens=pick(self.n_new_tokens),
            stop_reasons=pick(self.stop_reasons),
            nll_sum=pick(self.nll_sum),
            nll_count=pick(self.nll_count),
            token_ids=pick(self.token_ids),
            features=pick(self.features),
            reference_features=pick(self.reference_features),
            prompt_ids=pick(self.prompt_ids),
            answers=pick(self.answers),
            choices=pick(self.choices),
            seeds=pick(self.seeds),
            task=self.task,
        )


def _field(record: Any, name: str) -> Any:
    """`record[name]` for a mapping, `record.name` otherwise (e.g. a GenerationRecord); None if absent."""
    if isinstance(record, Mapping):
        return record.get(name)
    return getattr(record, name, None)


def _all_or_nothing(values: list[Any]) -> list[Any]:
    """The list if no value is missing, else [] (the metrics that need it are then empty)."""
    return values if all(v is not None for v in values) else []


def cell_data(records: Iterable[Mapping[str, Any] | Any]) -> CellData:
    """Build a cell's `CellData` from its generation records, tokenising each text once.

    `records` are GenerationRecord objects or dicts with its keys (lines of
    generations.jsonl), from any number of shards and seeds in any order: every metric
    is a function of the whole multiset of generations, so order and sharding do not
    change a value. Only `text` is required. `n_new_tokens`, `stop_reason` and
    `token_ids` are kept only when every record has them (otherwise the metrics that
    need them are empty); `reference`, `nll_sum`, `nll_count`, `features` and
    `reference_features` stay aligned, with None where a record has none.

    The reference row of a prompt set is `cell_data({"text": ref} for ref in refs)`:
    it has no references of its own, so BLEU/ROUGE are empty for it.
    """
    recs = list(records)
    texts = [_field(r, "text") or "" for r in recs]
    return CellData(
        texts=texts,
        words=[word_tokenize(t) for t in texts],
        references=[_field(r, "reference") for r in recs],
        n_new_tokens=_all_or_nothing([_field(r, "n_new_tokens") for r in recs]),
        stop_reasons=_all_or_nothing([_field(r, "stop_reason") for r in recs]),
        nll_sum=[_field(r, "nll_sum") for r in recs],
        nll_count=[_field(r, "nll_count") for r in recs],
        token_ids=_all_or_nothing([_field(r, "token_ids") for r in recs]),
        features=[_field(r, "features") for r in recs],
        reference_features=[_field(r, "reference_features") for r in recs],
        prompt_ids=[_field(r, "prompt_id") for r in recs],
        answers=[_gold(_field(r, "answer")) for r in recs],
        choices=[_field(r, "choices") for r in recs],
        seeds=[_field(r, "seed") for r in recs],
    )


def _gold(answer: Any) -> list[str] | None:
    """A record's gold answer as the list of accepted answers (a prompt may give one string or several)."""
    if answer is None:
        return None
    return [answer] if isinstance(answer, str) else list(answer)
