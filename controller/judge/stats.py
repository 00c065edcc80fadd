"""The judge's statistics: win rates, length-controlled win rates, grades, and agreement with human raters.

Win rate (pairwise): per variant and criterion, the mean over its judged pairs of 1 (win), ½ (tie) and 0
(loss) against the baseline; unparsed and failed pairs are counted apart and left out. Its 95% interval is
the report's studentised bootstrap over prompts (controller.report.stats.intervals; a prompt's seeds together).

Length-controlled win rate (AlpacaEval 2.0, Dubois et al. 2024): the logistic model
P(win) = σ(β₀ + β₁·tanh(Δ/s)) fitted to the outcomes (ties ½, a quasi-binomial fit), with Δ the variant's
answer length minus the baseline's in characters and s their standard deviation (ddof 0); the LC win
rate is σ(β₀), the win rate read at zero length difference. Its interval: a percentile bootstrap over prompts.
Where length separates the verdicts (every pair with a win in it at least as long as every pair with a loss in it,
or every one at most as long) the fit has no maximum and the LC win rate is NaN with the reason (`lc_fit`), as is
its interval where more than the tail share of resamples is so (`lc_interval`).

Every interval needs the report's minimum of prompts judged (`MIN_CI_PROMPTS`, 8; one seed or many): below it the
interval is NaN and the section says why (a bootstrap over 2 or 3 prompts draws one prompt alone too often to mean
anything).

Agreement with humans (where `decodebench rate import` brought ratings): single mode, Spearman's ρ between
the judge's grade and the item's mean human rating (interval: percentile bootstrap over prompts); pairwise,
the share of pairs, with both answers rated and the raters' means not equal, where the judge's decisive
outcome prefers the answer the raters scored higher (interval: studentised bootstrap over prompts).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from scipy import stats as sps

from controller.judge.verdicts import GRADES
from controller.metrics import ratio
from controller.report.load.jobs import MIN_CI_PROMPTS
from controller.report.stats.bootstrap_t import CI_LEVEL, PERCENTILES, studentized, values_of
from controller.report.stats.shares import share_interval, within_scale

SCORE = {"A": 1.0, "tie": 0.5, "B": 0.0}  # the variant's score of a pairwise outcome
N_BOOT_REFIT = 200  # bootstrap draws of statistics refitted per draw (LC win rate, ρ)
LC_SEPARATED = "LC not estimable: length separates the verdicts"
LC_UNCONVERGED = "LC not estimable: the fit did not converge"


def mean_interval(
    per_prompt: dict[str, list[float]], n_boot: int, rng: np.random.Generator, scale: tuple[float, float] = (0.0, 1.0)
):
    """(mean, low, high) of values grouped by prompt: the studentised bootstrap over prompts, inside `scale`, the values
    can take (a win rate's or a share's [0, 1], a grade's 1-10). A share whose every prompt holds one 0/1 outcome (one
    decided pair a prompt, no tie) gets the exact interval of its count, and one whose every value sits at an end of
    its scale (every pair won) the exact interval of none seen off it, not [1, 1] (`controller.report.stats.shares`)."""
    sums = np.array([[sum(v), len(v)] for v in per_prompt.values() if v], dtype=float)
    if len(sums) == 0:
        return math.nan, math.nan, math.nan
    value = float(sums[:, 0].sum() / sums[:, 1].sum())
    if len(sums) < MIN_CI_PROMPTS or n_boot <= 0:  # the report's own minimum (docs/reports.md)
        return value, math.nan, math.nan
    ci = studentized(sums, values_of(ratio), n_boot=n_boot, rng=rng, is_ratio=True)
    if scale == (0.0, 1.0):
        ci = share_interval(ci, sums, CI_LEVEL, of_ratio=True)
    else:
        ci = within_scale(ci, len(sums), CI_LEVEL, scale)
    return (value, *ci) if ci is not None else (value, math.nan, math.nan)


def separated(scores: np.ndarray, x: np.ndarray | None) -> bool:
    """Whether the outcomes are (quasi-)completely separated, so that the quasi-binomial fit has no maximum: every
    pair won or every one lost (the intercept alone, `x` None), or, with the length term `x`, the pairs with a win in
    them (a score over 0, a tie too) and those with a loss in them (under 1) overlapping in at most one length. With
    one covariate this is exact (Albert and Anderson 1984): a line through that point puts the wins on one side and
    the losses on the other, and the fit's slope runs off to infinity."""
    won, lost = scores > 0, scores < 1
    if not won.any() or not lost.any():
        return True
    if x is None:
        return False
    return bool(x[won].min() >= x[lost].max() or x[won].max() <= x[lost].min())


def lc_fit(scores: np.ndarray, len_diff: np.ndarray, iterations: int = 50) -> tuple[float, str | None]:
    """(σ(β₀), None) of the quasi-binomial fit of `scores` (1, ½, 0) on tanh(Δ/s) (see the module doc), or (NaN, why
    not): no pairs, length separating the verdicts (`separated`: no maximum, the value would follow the number of
    Newton steps to 0 or 1), or Newton not converging. Pairs that all went one way (or all tied): their win rate,
    the length model has nothing to adjust."""
    if len(scores) == 0:
        return math.nan, None
    if np.all(scores == scores[0]):
        return float(scores[0]), None
    s = float(np.std(len_diff))
    x = np.tanh(len_diff / s) if s > 0 else np.zeros_like(len_diff, dtype=float)
    if separated(scores, x if s > 0 else None):
        return math.nan, LC_SEPARATED
    design = np.column_stack([np.ones_like(x), x]) if s > 0 else np.ones((len(x), 1))
    beta = np.zeros(design.shape[1])
    ridge = 1e-6 * np.eye(design.shape[1])  # a steadier step; the gradient is not penalised, so the MLE is the same
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-(design @ beta)))
        grad = design.T @ (scores - p)
        hess = design.T @ (design * (p * (1 - p))[:, None]) + ridge
        step = np.linalg.solve(hess, grad)
        beta += step
        if np.max(np.abs(step)) < 1e-10:
            return float(1 / (1 + np.exp(-beta[0]))), None
    return math.nan, LC_UNCONVERGED


def lc_win_rate(scores: np.ndarray, len_diff: np.ndarray, iterations: int = 50) -> float:
    """σ(β₀) of the quasi-binomial fit (`lc_fit`); NaN where it is not estimable."""
    return lc_fit(scores, len_diff, iterations)[0]


def lc_of(records: list[dict]) -> tuple[float, str | None]:
    """The LC win rate of decided pairwise records, and why it is not estimable (None: it is)."""
    scores = np.array([SCORE[r["outcome"]] for r in records])
    return lc_fit(scores, np.array([r["len_diff"] for r in records], dtype=float))


def lc_interval(decided: list[dict], rng: np.random.Generator, n_boot: int) -> tuple[float, float, int, str | None]:
    """(low, high, resamples not estimable, why the interval is not) of the LC win rate: a percentile bootstrap
    over prompts, refitting each draw. A draw whose fit is not estimable (`lc_fit`) is skipped and counted; with
    more than the tail share ((1 − CI_LEVEL) / 2) of draws skipped the interval is NaN: where their values would
    lie is unknown, so either end could be one of them."""
    draws = np.array([lc_of(d)[0] for d in _resample(_by_prompt(decided), rng, n_boot)])
    fitted = draws[~np.isnan(draws)]
    skipped = len(draws) - len(fitted)
    if skipped > (1 - CI_LEVEL) / 2 * len(draws):
        why = (f"LC interval not estimable: {skipped} of {len(draws)} resamples could not be fitted (length separated"
               " their verdicts, or the fit did not converge)")  # fmt: skip
        return math.nan, math.nan, skipped, why
    low, high = (float(v) for v in np.percentile(fitted, PERCENTILES))
    return low, high, skipped, None


def _by_prompt(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[r["prompt_id"]].append(r)
    return out


def _resample(groups: dict[str, list], rng: np.random.Generator, n_boot: int):
    keys = list(groups)
    for idx in rng.integers(0, len(keys), size=(n_boot, len(keys))):
        yield [x for i in idx for x in groups[keys[i]]]


def pairwise_rows(records: list[dict], n_boot: int, seed: int = 0) -> list[dict]:
    """One row per (cell, criterion): win rate, its interval, LC win rate, its interval, counts of each outcome."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        grouped[(r["cell"], r["criterion"])].append(r)
    rows = []
    for i, ((cell, crit), recs) in enumerate(grouped.items()):
        rng = np.random.default_rng([seed, i])
        decided = [r for r in recs if r["outcome"] in SCORE]
        per_prompt = {p: [SCORE[r["outcome"]] for r in rs] for p, rs in _by_prompt(decided).items()}
        win, lo, hi = mean_interval(per_prompt, n_boot, rng)
        lc, why = lc_of(decided)
        lc_lo = lc_hi = math.nan
        skipped = 0
        if len({r["outcome"] for r in decided}) == 1:  # every pair won (or lost, or tied): the length model has
            lc_lo, lc_hi = lo, hi  # nothing to adjust and every resample fits the same; the win rate's interval
        elif why is None and len(per_prompt) >= MIN_CI_PROMPTS and n_boot > 0:
            lc_lo, lc_hi, skipped, why = lc_interval(decided, rng, min(n_boot, N_BOOT_REFIT))
        count = {o: sum(r["outcome"] == o for r in recs) for o in ("A", "B", "tie", "unparsed", "failed")}
        rows.append({"cell": cell, "criterion": crit, "baseline": recs[0]["baseline"], "win_rate": win,
                     "win_rate_ci_low": lo, "win_rate_ci_high": hi, "lc_win_rate": lc, "lc_win_rate_ci_low": lc_lo,
                     "lc_win_rate_ci_high": lc_hi, "lc_note": why or "", "lc_resamples_skipped": skipped,
                     "prompts": len(per_prompt),
                     "wins": count["A"], "losses": count["B"], "ties": count["tie"], "unparsed": count["unparsed"],
                     "failed": count["failed"]})  # fmt: skip
    return rows


def single_rows(records: list[dict], n_boot: int, seed: int = 0) -> list[dict]:
    """One row per (cell, criterion): the mean 1-10 grade, its interval, counts graded/unparsed/failed."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        grouped[(r["cell"], r["criterion"])].append(r)
    rows = []
    for i, ((cell, crit), recs) in enumerate(grouped.items()):
        graded = [r for r in recs if r["grade"] is not None]
        per_prompt = {p: [r["grade"] for r in rs] for p, rs in _by_prompt(graded).items()}
        grade, lo, hi = mean_interval(per_prompt, n_boot, np.random.default_rng([seed, i]), GRADES)
        rows.append({"cell": cell, "criterion": crit, "grade": grade, "grade_ci_low": lo, "grade_ci_high": hi,
                     "prompts": len(per_prompt),
                     "graded": len(graded), "unparsed": sum(r["outcome"] == "unparsed" for r in recs),
                     "failed": sum(r["outcome"] == "failed" for r in recs)})  # fmt: skip
    return rows


def human_means(key: dict, sheets: dict) -> dict[tuple[str, str, int | None, int | None], dict[str, float]]:
    """(cell, prompt_id, job_seed, sample) -> {criterion: mean rating over raters, "all": mean over criteria}; a key
    exported before keys named the sample names none: its items count as sample 0 (they may have been drawn from
    any sample; such a key's ratings of a variant with samples can meet the wrong sample's verdict)."""
    out = {}
    for item, where in key["items"].items():
        scores: dict[str, list[int]] = defaultdict(list)
        for sheet in sheets.values():
            for c, v in sheet.get(item, {}).items():
                scores[c].append(v)
        if scores:
            means = {c: float(np.mean(v)) for c, v in scores.items()}
            means["all"] = float(np.mean(list(means.values())))
            coords = (where.get("job_seed"), where.get("sample", 0))  # a reference item: seed and sample None
            out[(where["cell"], where["prompt_id"], *coords)] = means
    return out


def _human(means: dict, crit: str) -> float | None:
    return means.get(crit, means.get("all"))


def agreement(records: list[dict], humans: dict, mode: str, n_boot: int, seed: int = 0) -> list[dict]:
    """Per criterion: the judge's agreement with the raters on the items both judged (see the module doc)."""
    rows = []
    for i, crit in enumerate(sorted({r["criterion"] for r in records})):
        rng = np.random.default_rng([seed, i, 7])
        pts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in records:
            if r["criterion"] != crit:
                continue
            # verdicts stored before samples were judged name none: sample 0, the baseline's answer at the same seed
            mine = humans.get((r["cell"], r["prompt_id"], r["job_seed"], r.get("sample", 0)))
            if mode == "single":
                if mine is not None and r["grade"] is not None:
                    pts[r["prompt_id"]].append((r["grade"], _human(mine, crit)))  # type: ignore[arg-type]
                continue
            seen = (r.get("baseline_job_seed", r["job_seed"]), r.get("baseline_sample", 0))
            base = humans.get((r["baseline"], r["prompt_id"], *seen))
            if mine is None or base is None or r["outcome"] not in ("A", "B"):
                continue
            h_mine, h_base = _human(mine, crit), _human(base, crit)
            if h_mine is None or h_base is None or h_mine == h_base:
                continue
            pts[r["prompt_id"]].append((float((r["outcome"] == "A") == (h_mine > h_base)), 1.0))
        n = sum(len(v) for v in pts.values())
        if mode == "single":
            flat = np.array([p for v in pts.values() for p in v]).reshape(-1, 2)
            rho = spearman(flat)
            lo = hi = math.nan
            if len(pts) >= MIN_CI_PROMPTS and n_boot > 0 and not math.isnan(rho):
                draws = [spearman(np.array(d).reshape(-1, 2)) for d in _resample(pts, rng, min(n_boot, N_BOOT_REFIT))]
                lo, hi = (float(v) for v in np.nanpercentile(draws, PERCENTILES))
            rows.append(
                {
                    "criterion": crit,
                    "statistic": "spearman_rho",
                    "value": rho,
                    "ci_low": lo,
                    "ci_high": hi,
                    "n": n,
                    "prompts": len(pts),
                }
            )
        else:
            share, lo, hi = mean_interval({p: [a for a, _ in v] for p, v in pts.items()}, n_boot, rng)
            rows.append({"criterion": crit, "statistic": "pair_agreement", "value": share, "ci_low": lo,
                         "ci_high": hi, "n": n, "prompts": len(pts)})  # fmt: skip
    return rows


def spearman(points: np.ndarray) -> float:
    """Spearman's ρ of the two columns; NaN with fewer than 3 points or a constant column."""
    if len(points) < 3 or np.ptp(points[:, 0]) == 0 or np.ptp(points[:, 1]) == 0:
        return math.nan
    return float(sps.spearmanr(points[:, 0], points[:, 1]).statistic)
