"""The judge in a sweep's report: its columns in the summary and its section in summary.md and report.html.

`judge_summary(store, tenant, sweep_id, spec, results, cell_order, n_boot)` runs the judge
(controller.judge.run, controller.judge.jobs: cached, budgeted, sent by report tasks) and its statistics
(controller.judge.stats), with the agreement with imported human ratings where there are any;
`add_judge(summary, doc)` joins per cell and criterion c the columns `judge_c_win_rate`, `judge_c_lc_win_rate`
(pairwise) or `judge_c_grade` (single), each with `_ci_low`/`_ci_high`, and keeps the whole doc in
`summary.attrs["judge"]`, which `judge_markdown` and `judge_html` render.
"""

from __future__ import annotations

import math
from html import escape as e
from typing import Any

import pandas as pd

from controller.judge import stats
from controller.report.compute.columns import REFERENCE
from controller.sweep.labels import key_labels

NOTE = (
    "LLM judge ({judge}, template {template} sha256 {sha}). Pairwise: each cell against its baseline on the same "
    "prompts and seeds, asked in both orders; a verdict that changes with the order is a tie. Win rate: wins + ½ "
    "ties over decided pairs, 95% bootstrap interval over prompts; LC: AlpacaEval 2.0's length-controlled win rate "
    "(read at zero length difference). Unparsed and failed verdicts are counted, not scored. See docs/judge.md."
)
SINGLE_NOTE = (
    "LLM judge ({judge}, template {template} sha256 {sha}): 1-10 grades (MT-Bench), mean with a 95% bootstrap "
    "interval over prompts; unparsed and failed verdicts are counted, not scored. See docs/judge.md."
)


def judge_summary(store, tenant: str, sweep_id: str, spec: dict, results, cell_order: list[str], n_boot: int,
                  *, dry_run: bool = False, runner=None, limits=None) -> dict[str, Any] | None:  # fmt: skip
    """The judge's doc for the report (None: the sweep has no judge); `dry_run`: the plan's line only;
    `runner`: where the requests' shares run (controller.judge.jobs; default: here); `limits`: the JudgeLimits of
    the sweep file `run` was given, in place of the stored spec's (they are not part of the sweep id, so a raised
    limit reports the same sweep). Over a limit, nothing is sent and the doc's `not_judged` says why: the rest of
    the report is written, and the command then stops on that line (`not_judged`)."""
    from controller.judge.jobs import judge_sweep
    from controller.judge.run import OverBudget, check_budget, judge_of
    from worker.core.errors import UsageError

    judge = judge_of(spec)
    if judge is None:
        return None
    if limits is not None:
        judge = judge.model_copy(update={"limits": limits})
    try:
        plan, records = judge_sweep(store, tenant, sweep_id, judge, results, cell_order, runner=runner, dry_run=dry_run)
    except OverBudget as err:
        again = (
            "raise it in the sweep file and `decodebench run` or `submit` it again (its jobs are kept: a run makes "
            "only the report; after a submission, `decodebench report` it)"
        )
        return {"mode": judge.mode, "plan": str(err), "sent": 0, "rows": [], "not_judged": f"{err}; {again}"}
    doc: dict[str, Any] = {"mode": judge.mode, "plan": plan.line(), "sent": 0 if dry_run else len(plan.missing)}
    if dry_run:
        try:
            check_budget(plan, judge.limits)
            doc["plan"] += " (within judge.limits)"
        except UsageError as err:
            doc["plan"] = str(err)
        return doc
    return verdicts_doc(store, tenant, sweep_id, judge.mode, records, n_boot, doc)


def verdicts_doc(store, tenant: str, sweep_id: str, mode: str, records: list[dict], n_boot: int,
                 doc: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The judge's doc of its verdict records (`doc`'s plan kept): its statistics' rows, and the agreement with the
    sweep's imported human ratings where there are any."""
    from controller.report.ratings.scores import pooled

    rows = (stats.single_rows if mode == "single" else stats.pairwise_rows)(records, n_boot)
    key, sheets = pooled(store, tenant, sweep_id)  # every rating round, pooled as the report pools them
    humans = stats.human_means(key, sheets) if key is not None and sheets else {}
    first = records[0] if records else {}
    return {**(doc or {"mode": mode}), "judge": first.get("judge", ""), "template": first.get("template", ""),
            "template_sha256": first.get("template_sha256", ""), "rows": rows,
            "agreement": stats.agreement(records, humans, mode, n_boot) if humans else []}  # fmt: skip


def stored_judge(store, tenant: str, sweep_id: str, spec: dict, n_boot: int) -> dict[str, Any] | None:
    """The judge's doc of the verdicts the last report stored (report/judge-verdicts.jsonl), sending nothing and
    writing nothing: what a recomputed summary in Python shows (controller.report.api.load_summary); None without
    a judge or its verdicts."""
    from controller.judge.run import judge_of
    from worker.core import paths

    judge = judge_of(spec)
    key = paths.report_key(tenant, sweep_id, paths.JUDGE_VERDICTS_FILE)
    if judge is None or not store.exists(key):
        return None
    records = list(store.read_jsonl(key))
    return verdicts_doc(store, tenant, sweep_id, judge.mode, records, n_boot, {"mode": judge.mode, "plan": "stored"})


def not_judged(summary: pd.DataFrame) -> str | None:
    """Why the sweep's judge sent nothing (over a `judge.limits` budget), where it did not: the report is written
    without its verdicts, and `run` and `report` then stop on this line."""
    return (summary.attrs.get("judge") or {}).get("not_judged")


def add_judge(summary: pd.DataFrame, doc: dict[str, Any] | None) -> pd.DataFrame:
    """The summary with the judge's per-cell columns joined on `cell`, and the doc in attrs["judge"]."""
    if doc is not None and doc.get("not_judged"):
        out = summary.copy()
        out.attrs = {**summary.attrs, "judge": doc}
        return out
    if doc is None or not doc.get("rows"):
        return summary
    wide: dict[str, dict[str, float]] = {}
    for r in doc["rows"]:
        for m in ("win_rate", "lc_win_rate", "grade"):
            if m in r:
                for s in ("", "_ci_low", "_ci_high"):
                    wide.setdefault(r["cell"], {})[f"judge_{r['criterion']}_{m}{s}"] = r[m + s]
    frame = pd.DataFrame([{"cell": c, **v} for c, v in wide.items()])
    out = summary.merge(frame, on="cell", how="left")
    out.attrs = {**summary.attrs, "judge": doc}
    return out


def _f(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _ci(r: dict, m: str) -> str:
    return f"{_f(r[m])} [{_f(r[m + '_ci_low'])}, {_f(r[m + '_ci_high'])}]"


def _lc(r: dict) -> str:
    """The LC win rate's cell: with why it (or its interval) is not estimable, where it is not."""
    note = r.get("lc_note")
    return f"{_ci(r, 'lc_win_rate')} ({note})" if note else _ci(r, "lc_win_rate")


def judge_table(summary: pd.DataFrame) -> tuple[str, list[str], list[list[str]], list[list[str]]] | None:
    """(note, header, rows, agreement rows) of the judge's section; None without a judge."""
    doc = summary.attrs.get("judge")
    if not doc or not doc.get("rows"):
        return None
    cells = list(summary.loc[summary["strategy"] != REFERENCE, "cell"])
    labels = dict(zip(cells, key_labels(cells)))  # as every other view names them (docs/reports.md, "Labels")
    fmt = {"judge": doc["judge"], "template": doc["template"], "sha": doc["template_sha256"][:12]}
    if doc["mode"] == "single":
        header = ["cell", "criterion", "grade [95% CI]", "graded", "unparsed", "failed"]
        rows = [[labels.get(r["cell"], r["cell"]), r["criterion"], _ci(r, "grade"), str(r["graded"]),
                 str(r["unparsed"]), str(r["failed"])] for r in doc["rows"]]  # fmt: skip
        note = SINGLE_NOTE.format(**fmt)
    else:
        header = ["cell", "baseline", "criterion", "win rate [95% CI]", "LC win rate [95% CI]", "W/T/L",
                  "unparsed", "failed"]  # fmt: skip
        rows = [[labels.get(r["cell"], r["cell"]), labels.get(r["baseline"], r["baseline"]), r["criterion"],
                 _ci(r, "win_rate"), _lc(r), f"{r['wins']}/{r['ties']}/{r['losses']}",
                 str(r["unparsed"]), str(r["failed"])] for r in doc["rows"]]  # fmt: skip
        note = NOTE.format(**fmt)
    few = min(r["prompts"] for r in [*doc["rows"], *doc.get("agreement", [])])
    if few < stats.MIN_CI_PROMPTS:
        note += f" No interval where fewer than {stats.MIN_CI_PROMPTS} prompts were judged (here as few as {few})."
    agree = [[a["criterion"], "Spearman ρ (grade vs mean rating)" if a["statistic"] == "spearman_rho" else
              "share of pairs preferring the raters' choice", f"{_f(a['value'])} [{_f(a['ci_low'])}, "
              f"{_f(a['ci_high'])}]", str(a["n"])] for a in doc.get("agreement", [])]  # fmt: skip
    return note, header, rows, agree


AGREE_HEADER = ["criterion", "agreement with human raters", "value [95% CI]", "n"]


def judge_markdown(summary: pd.DataFrame) -> list[str]:
    """summary.md's judge section (nothing without a judge)."""
    if why := not_judged(summary):
        return ["## LLM judge", "", f"**Not judged: {why}.**", ""]
    table = judge_table(summary)
    if table is None:
        return []
    note, header, rows, agree = table

    def md(head: list[str], body: list[list[str]]) -> list[str]:
        cells = [[c.replace("|", "\\|") for c in r] for r in body]
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in cells)]

    lines = ["## LLM judge", "", note, "", *md(header, rows), ""]
    if agree:
        lines += ["### Judge vs human raters", "", *md(AGREE_HEADER, agree), ""]
    return lines


def judge_html(summary: pd.DataFrame) -> str:
    """report.html's judge section (empty without a judge)."""
    if why := not_judged(summary):
        return f'<h2 id="judge">LLM judge</h2><p><strong>Not judged: {e(why)}.</strong></p>'
    table = judge_table(summary)
    if table is None:
        return ""
    note, header, rows, agree = table

    def html(head: list[str], body: list[list[str]]) -> str:
        th = "".join(f"<th>{e(h)}</th>" for h in head)
        trs = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in body)
        return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"

    out = f'<h2 id="judge">LLM judge</h2><p class="small">{e(note)}</p>{html(header, rows)}'
    if agree:
        out += f'<h3 id="judge-humans">Judge vs human raters</h3>{html(AGREE_HEADER, agree)}'
    return out
