"""Cross-engine columns of a summary (docs/engines.md), present only where a sweep runs another engine
than the own one, so that every other sweep's report keeps its columns.

- `engine`: the cell's engine label (decodebench, vllm, ...);
- `engine_agreement`: for a deterministic strategy (greedy, beam) on another engine, the fraction of
  generations whose tokens equal the own engine's for the same model, variant, prompt, seed and sample.
  Sampled strategies are compared by distribution, not text (`worker.engine.vllm.agreement`): empty here;
- `engine_gtest_p`: for a sampled strategy on vLLM, the p-value of the G-test its worker ran (the first
  token of the first prompt against the strategy's definition on vLLM's logits, result.json's
  `engine.distribution_check`; the lowest seed's): uniform on [0, 1] when vLLM samples by the definition.

And, where any cell's own-engine jobs ran another decode step than the eager one (the static step or CUDA
graphs, result.json's `engine.decode_step`; docs/performance.md#cuda-graphs), `decode_step`: the step
each cell ran (`eager` where its jobs record none, `mixed` where they differ).
"""

from __future__ import annotations

from typing import Any

from worker.core.engines import OWN_ENGINE, engine_label
from worker.core.results import GenerationRecord
from worker.strategies import get_strategy

ENGINE_COLUMN = "engine"
AGREEMENT_COLUMN = "engine_agreement"
GTEST_COLUMN = "engine_gtest_p"
TRAILING = [AGREEMENT_COLUMN, GTEST_COLUMN]  # after the summary's other columns
DECODE_STEP_COLUMN = "decode_step"


def has_engines(rows: list[dict[str, Any]]) -> bool:
    return any(row.get(ENGINE_COLUMN) not in (None, OWN_ENGINE) for row in rows)


def token_agreement(a: list[GenerationRecord], b: list[GenerationRecord]) -> float | None:
    """Fraction of the (prompt, seed, sample) generations both cells made whose token ids are identical."""
    theirs = {(g.prompt_id, g.job_seed, g.sample): g.token_ids for g in b}
    pairs = [(g.token_ids, theirs[k]) for g in a if (k := (g.prompt_id, g.job_seed, g.sample)) in theirs]
    return sum(x == y for x, y in pairs) / len(pairs) if pairs else None


def gtest_p(results: list[Any]) -> float | None:
    """The distribution check's p-value of a cell's results (its lowest seed's), None where none ran."""
    checks = [(r.job.seed, c) for r in results if "p_value" in (c := (r.engine or {}).get("distribution_check") or {})]
    return min(checks, key=lambda sc: sc[0])[1]["p_value"] if checks else None


def decode_step(results: list[Any]) -> str | None:
    """The decode step a cell's jobs ran: None where every one ran the eager step (or another engine's)."""
    steps = {_step((r.engine or {}).get("decode_step")) or "eager" for r in results}
    if steps == {"eager"}:
        return None
    return steps.pop() if len(steps) == 1 else "mixed"


def _step(recorded: Any) -> str | None:
    """The mode of an engine record's decode step (a JobResult's is result.json's dict, a JobInfo's its mode)."""
    return recorded.get("mode") if isinstance(recorded, dict) else recorded


def has_decode_steps(rows: list[dict[str, Any]]) -> bool:
    return any(row.get(DECODE_STEP_COLUMN) for row in rows)


def engine_row(job: Any, results: list[Any]) -> dict[str, Any]:
    """A cell's engine columns known from its results: its engine's label, the distribution check, the decode step."""
    step = decode_step(results)
    return {ENGINE_COLUMN: engine_label(job.engine), GTEST_COLUMN: gtest_p(results), DECODE_STEP_COLUMN: step}


def _pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(another engine's deterministic row, its own-engine twin's cell) for every such row with a twin."""
    cells = {row["cell"] for row in rows}
    out = []
    for row in rows:
        engine, strategy = row.get(ENGINE_COLUMN), row.get("strategy")
        if engine in (None, OWN_ENGINE) or get_strategy(strategy).stochastic:
            continue
        own = row["cell"].rsplit("::", 1)[0]  # plan.cell_key: the own engine's cell has no engine suffix
        if own in cells:
            out.append((row, own))
    return out


def agreement_cells(rows: list[dict[str, Any]]) -> set[str]:
    """The cells whose records `add_agreement` reads (a streamed report loads only these)."""
    return {c for row, own in _pairs(rows) for c in (row["cell"], own)}


def add_agreement(rows: list[dict[str, Any]], records_by_cell: dict[str, list[GenerationRecord]]) -> None:
    """`engine_agreement` on every other engine's deterministic row that has an own-engine twin."""
    for row, own in _pairs(rows):
        row[AGREEMENT_COLUMN] = token_agreement(records_by_cell.get(row["cell"], []), records_by_cell.get(own, []))
