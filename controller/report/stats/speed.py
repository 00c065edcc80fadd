"""A cell's speed and memory columns, from the raw per-batch timings of its jobs.

Percentiles are taken over generations (a batch of n contributes n values) only here, at
report time; a continuous-refill stream contributes each generation's own latency, time to
first token and time per output token (docs/metrics.md).
"""

from __future__ import annotations

import math
import statistics
import zlib
from typing import Any

import numpy as np

from controller.metrics import ratio
from controller.report.stats.bootstrap_t import bounded, studentized, values_of
from worker.core.results import JobResult

# the memory readings of a result that the speed columns use (report.jobs keeps only these)
MEMORY_KEYS = ("torch_peak_mb", "rss_peak_mb", "nvml_peak_mb", "nvml_mean_mb", "gpu_util_mean")

# The spread of speed: a 95% interval of tokens/s over batches, and the range over batches of
# tokens/s and of each batch's median latency and TTFT (a busy machine shows here).
SPREAD_COLUMNS = [
    "tokens_per_s_ci_low",
    "tokens_per_s_ci_high",
    "tokens_per_s_batch_min",
    "tokens_per_s_batch_max",
    "latency_ms_batch_min",
    "latency_ms_batch_max",
    "ttft_ms_batch_min",
    "ttft_ms_batch_max",
]


def _percentiles(values: list[float], qs: list[float]) -> list[float]:
    if not values:
        return [math.nan] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, dtype=float), qs)]


def _batches(results) -> list[tuple[Any, int]]:
    """Every batch of the results with its generations: n prompts of `samples` generations each."""
    return [(b, b.n * r.job.strategy.n_samples) for r in results for b in r.batches]


def _per_generation(batches: list[tuple[Any, int]], own: str, whole: str) -> list[float]:
    """Milliseconds a generation: its own `own` where its batch recorded one a generation (a stream), else its
    batch's `whole` once for each of the batch's generations (every sample of a prompt counts, as in a stream)."""
    return [1000.0 * s for b, gens in batches for s in (getattr(b, own) or [getattr(b, whole)] * gens)]


def _tpot_ms(batches: list[tuple[Any, int]]) -> float | None:
    """The mean over generations of their own TPOT where a stream recorded it (None: no stream).

    A plain batch's generations each count its per-step time (decode_s / (steps - 1))."""
    if not any(b.tpot_s for b, _ in batches):
        return None
    per_row = []
    for b, gens in batches:
        if b.tpot_s is not None:
            per_row += [t for t in b.tpot_s if t is not None]
        elif b.steps and b.steps > 1:
            per_row += [b.decode_s / (b.steps - 1)] * gens
    return 1000.0 * float(np.mean(per_row)) if per_row else math.nan


def speed_columns(results: list[JobResult]) -> dict[str, Any]:
    """Speed and memory of a cell from the raw per-batch values of all its jobs (JobResults or report.jobs.JobInfos)."""
    batches = [b for r in results for b in r.batches]
    new_tokens = sum(b.new_tokens for b in batches)
    total_s = sum(b.total_s for b in batches)
    decode_s = sum(b.decode_s for b in batches)
    decode_steps = sum(max(b.steps - 1, 0) for b in batches if b.steps is not None)
    counted = _batches(results)
    tpot_ms = _tpot_ms(counted)
    if tpot_ms is None:  # batches only: every row advances one token per decoding step
        tpot_ms = decode_s * 1000.0 / decode_steps if decode_steps > 0 else math.nan
    # per generation: its own times where the batch recorded them (continuous refill), else the batch's
    latency = _per_generation(counted, "latency_s", "total_s")
    ttft = _per_generation(counted, "ttft_s", "prefill_s")
    p50, p95 = _percentiles(latency, [50, 95])
    (ttft50,) = _percentiles(ttft, [50])

    def values(key: str) -> list[float]:
        return [float(r.memory[key]) for r in results if r.memory.get(key) is not None]

    torch_peak, rss_peak = values("torch_peak_mb"), values("rss_peak_mb")
    peak, kind = (max(torch_peak), "torch") if torch_peak else (max(rss_peak), "rss") if rss_peak else (math.nan, None)
    nvml_peak = values("nvml_peak_mb")
    # energy only where every batch has an NVML energy reading: empty (NaN), never zero, elsewhere
    energy = [b.energy_j for b in batches]
    joules = sum(energy) / new_tokens if batches and new_tokens > 0 and None not in energy else math.nan

    def time_weighted(key: str) -> float:
        pairs = [
            (float(r.memory[key]), sum(b.total_s for b in r.batches)) for r in results if r.memory.get(key) is not None
        ]
        weight = sum(w for _, w in pairs)
        if not pairs:
            return math.nan
        return sum(v * w for v, w in pairs) / weight if weight > 0 else float(np.mean([v for v, _ in pairs]))

    return {
        "tokens_per_s": new_tokens / total_s if total_s > 0 else math.nan,
        "latency_ms_p50": p50,
        "latency_ms_p95": p95,
        "ttft_ms_p50": ttft50,
        "peak_memory_mb": peak,
        "decode_ms_per_token": tpot_ms,  # time per output token after the first (TPOT)
        "joules_per_token": joules,
        "joules_per_1k_tokens": joules * 1000.0,
        "nvml_peak_mb": max(nvml_peak) if nvml_peak else math.nan,
        "nvml_mean_mb": time_weighted("nvml_mean_mb"),
        "gpu_util_mean": time_weighted("gpu_util_mean"),
        "memory_kind": kind,
    }


def _plan_order(r) -> tuple:
    return (r.job.seed, r.job.shard, r.job.job_id)


def job_units(r) -> tuple[tuple, list[list[float]]]:
    """A job's place in the plan's order and [new tokens, seconds] of each of its timed batches."""
    return _plan_order(r), [[b.new_tokens, b.total_s] for b in r.batches if b.total_s > 0]


def batch_units(results) -> list[list[float]]:
    """[new tokens, seconds] of each timed batch of a cell, in the plan's order (seed, then shard), whatever
    order the results came in (the store lists them, a sweep in memory holds them as run): the bootstrap
    draws batch indices, so an interval must not depend on that order; one shard and the same prompts in
    four give the same batches in the same order. What a cell's map needs for `rate_interval`."""
    return join_units(map(job_units, results))


def join_units(per_job) -> list[list[float]]:
    """The jobs' `job_units`, in the plan's order, as one list of batches."""
    return [u for _, units in sorted(per_job) for u in units]


def rate_interval(units: list[list[float]], cell: str, *, n_boot: int, seed: int) -> dict[str, float]:
    """tokens/s's 95% interval: the studentised bootstrap over batches of Σ new tokens / Σ time (the
    column's own ratio), seeded by (seed, cell); NaN with fewer than two batches or no replicates. The
    map computes it (a cell's task carries its batches' units), not the controller."""
    out = {"tokens_per_s_ci_low": math.nan, "tokens_per_s_ci_high": math.nan}
    if len(units) >= 2 and n_boot > 0:
        rng = np.random.default_rng([seed, zlib.crc32(cell.encode())])
        interval = studentized(np.asarray(units, dtype=float), values_of(ratio), n_boot=n_boot, rng=rng, is_ratio=True)
        if interval is not None:  # a rate: at least 0
            out["tokens_per_s_ci_low"], out["tokens_per_s_ci_high"] = bounded(interval, (0.0, None))
    return out


def speed_ranges(results: list[JobResult]) -> dict[str, float]:
    """SPREAD_COLUMNS but the interval (NaN, `rate_interval` fills it): the smallest and largest batch's
    tokens/s, and of the batches' median latency and TTFT (each generation's own where a stream
    recorded it); NaN where the cell has no timed batch."""
    batches = [b for r in results for b in r.batches if b.total_s > 0]
    out = dict.fromkeys(SPREAD_COLUMNS, math.nan)
    if not batches:
        return out
    rates = [b.new_tokens / b.total_s for b in batches]
    # statistics.median gives numpy's number (the mean of the two middle values), 30x faster on a few values
    latency = [1000.0 * float(statistics.median(b.latency_s or [b.total_s])) for b in batches]
    ttft = [1000.0 * float(statistics.median(b.ttft_s or [b.prefill_s])) for b in batches]
    out |= {"tokens_per_s_batch_min": min(rates), "tokens_per_s_batch_max": max(rates)}
    out |= {"latency_ms_batch_min": min(latency), "latency_ms_batch_max": max(latency)}
    out |= {"ttft_ms_batch_min": min(ttft), "ttft_ms_batch_max": max(ttft)}
    return out


def unresolved_speed(rows: list[tuple[str, float, float, float]]) -> list[tuple[str, str]]:
    """Neighbours in tokens/s order whose intervals overlap: their speed ordering is not resolved.

    `rows`: (label, tokens/s, ci low, ci high) of each cell; cells without an interval are left out."""
    ranked = sorted((r for r in rows if all(math.isfinite(v) for v in r[1:])), key=lambda r: r[1])
    return [(a[0], b[0]) for a, b in zip(ranked, ranked[1:]) if a[3] >= b[2]]


def unresolved_note(pairs: list[tuple[str, str]]) -> str:
    """One sentence for the report; empty when every neighbouring pair is resolved."""
    if not pairs:
        return ""
    shown = "; ".join(f"{a} and {b}" for a, b in pairs[:8]) + (f"; and {len(pairs) - 8} more" if len(pairs) > 8 else "")
    return (
        f"Speed ordering not resolved: the 95% tokens/s intervals (over batches) overlap for {shown}. "
        "Their order on the speed axis may be noise; rerun on a quiet machine or with more batches."
    )


def untested_note(rows: list[tuple[str, float, float, float]]) -> str:
    """The sentence naming the cells whose tokens/s has no interval beside others' speed (empty where every timed
    cell has one, or only one cell is timed), of which the unresolved note can say nothing: most often a cell timed
    as one continuous-refill stream (the default for a job of several batches), which is one unit of the interval."""
    timed = [r for r in rows if math.isfinite(r[1])]
    bare = [r[0] for r in timed if not (math.isfinite(r[2]) and math.isfinite(r[3]))]
    if len(timed) < 2 or not bare:
        return ""
    shown = "; ".join(bare[:8]) + (f"; and {len(bare) - 8} more" if len(bare) > 8 else "")
    return (
        f"Speed ordering untested for {shown}: no tokens/s interval, from fewer than two timed units (a batch, or a "
        "whole continuous-refill stream: one a job by default) or no bootstrap (--n-boot 0). More seeds or shards "
        "give a unit each, refill: false one a batch."
    )


def speed_note(rows: list[tuple[str, float, float, float]]) -> str:
    """What the report says of the cells' speed ordering: `unresolved_note` and `untested_note`.

    `rows`: (label, tokens/s, ci low, ci high) of each cell."""
    return " ".join(n for n in (unresolved_note(unresolved_speed(rows)), untested_note(rows)) if n)
