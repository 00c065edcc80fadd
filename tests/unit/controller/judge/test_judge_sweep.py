"""A sweep with a judge, reported: win rates in summary.md and report.html, the cache (a second report sends
nothing), the budget, --dry-run, unparsed verdicts, and the API key kept out of everything written."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.report.api import cell_labels
from tests.support.judge import JudgeServer, verdict_for
from tests.support.report import make_sweep, write_with_hashes
from worker.core import paths
from worker.store import FileStore

CELLS = [("austen-tiny", "greedy", {}), ("austen-tiny", "top_p", {"p": 0.9})]
N_PROMPTS = 8


def sweep(tmp_path, url: str, **judge):
    store = FileStore(tmp_path / "store")
    data = make_sweep(n_prompts=N_PROMPTS, cells=CELLS)
    data.spec["judge"] = {"url": url, "model": "stand-in", "baseline": "greedy", **judge}
    write_with_hashes(store, data)
    return store, data


def report(store, data, *args, env=None):
    return CliRunner().invoke(main, ["report", data.sweep_id, "--store", store.url, "--no-progress", "--n-boot",
                                     "200", *args], env=env)  # fmt: skip


def verdicts(store, data) -> list[dict]:
    return list(store.read_jsonl(paths.report_key(data.tenant, data.sweep_id, paths.JUDGE_VERDICTS_FILE)))


def md_of(store, data) -> str:
    return store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "summary.md")).decode()


def test_pairwise_report_shows_win_rates_and_a_second_report_sends_nothing(tmp_path):
    with JudgeServer() as srv:
        store, data = sweep(tmp_path, srv.url, criteria=["overall", "fluency"])
        first = report(store, data)
        assert first.exit_code == 0, first.output
        sent = srv.hits
        assert sent == N_PROMPTS * 2 * 2  # prompts x both orders x criteria, the baseline not judged against itself
        again = report(store, data)
        assert again.exit_code == 0, again.output
        assert srv.hits == sent  # every request came from the cache
    assert all(b["temperature"] == 0 for b in srv.bodies)
    recs = verdicts(store, data)
    assert len(recs) == N_PROMPTS * 2 and {r["template"] for r in recs} == {"pairwise-v1.txt"}
    assert all(len(r["template_sha256"]) == 64 for r in recs)
    overall = [r for r in recs if r["criterion"] == "overall"]
    score = {"A": 1, "tie": 0.5, "B": 0}
    win = sum(score[r["outcome"]] for r in overall) / len(overall)
    md = md_of(store, data)
    assert "## LLM judge" in md and "LC win rate" in md and f"{win:.3f} [" in md
    html = store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "report.html")).decode()
    assert 'id="judge"' in html
    summary = json.loads(store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "summary.json")))
    row = next(r for r in summary["rows"] if r["cell"].endswith("top_p(p=0.9)"))
    assert row["judge_overall_win_rate"] == pytest.approx(win)
    # the judge's table names cells as every other view does (one label rule, docs/reports.md "Labels")
    labels = set(cell_labels(pd.DataFrame(summary["rows"])))
    judged = md.split("## LLM judge")[1].split("\n## ")[0]
    rows = [line for line in judged.splitlines() if line.startswith("| ") and "criterion" not in line]
    named = {line.split("|")[1].strip() for line in rows}
    assert named and named <= labels, (named, labels)


def test_unparsed_verdicts_are_counted_and_shown_never_ties(tmp_path):
    def sloppy(messages):  # every verdict on prompt p003 written badly
        return "I cannot decide." if "Prompt number 3 " in messages[-1]["content"] else verdict_for(messages)

    with JudgeServer(verdict=sloppy) as srv:
        store, data = sweep(tmp_path, srv.url)
        assert report(store, data).exit_code == 0
    recs = verdicts(store, data)
    bad = [r for r in recs if r["outcome"] == "unparsed"]
    assert [r["prompt_id"] for r in bad] == ["p003"] and bad[0]["first"] == "unparsed"
    line = next(x for x in md_of(store, data).splitlines() if "top_p" in x and "| overall |" in x)
    assert line.rstrip(" |").endswith("| 1 | 0")  # unparsed 1, failed 0


def test_the_budget_refuses_before_sending_and_dry_run_prints_the_count(tmp_path):
    with JudgeServer() as srv:
        store, data = sweep(tmp_path, srv.url, limits={"max_requests": 5})
        dry = report(store, data, "--dry-run")
        assert dry.exit_code == 0 and "16 to send" in dry.output and "max_requests 5" in dry.output
        over = report(store, data)
        assert over.exit_code == 2, over.output
        error = over.output.strip().splitlines()[-1]  # one line, after the report it did write
        assert error.startswith("error: ") and "16 to send" in error and "raise it to 16" in error
        assert srv.hits == 0
    # the rest of the report is written (it was not: a budget stopped everything), its judge section says why
    md = md_of(store, data)
    assert "## Overview" in md and "**Not judged: judge: 16 requests" in md and "raise it to 16" in md
    html = store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "report.html")).decode()
    assert "Not judged: judge: 16 requests" in html


def test_failed_requests_are_counted_and_asked_again_by_the_next_report(tmp_path):
    with JudgeServer([(400, {}, b"{}", 0)] * 2) as srv:
        store, data = sweep(tmp_path, srv.url, limits={"concurrency": 1})
        assert report(store, data).exit_code == 0
        assert sum(r["outcome"] == "failed" for r in verdicts(store, data)) >= 1
        hits = srv.hits
        assert report(store, data).exit_code == 0
        assert srv.hits - hits == 2  # only the two failed requests were sent again
    assert not any(r["outcome"] == "failed" for r in verdicts(store, data))


def test_the_api_key_is_sent_but_never_written_or_printed(tmp_path):
    secret = "sk-judge-Zx81-very-secret"
    with JudgeServer() as srv:
        store, data = sweep(tmp_path, srv.url, api_key_env="JUDGE_TEST_KEY")
        out = report(store, data, env={"JUDGE_TEST_KEY": secret})
        assert out.exit_code == 0, out.output
    assert set(srv.auth) == {f"Bearer {secret}"}
    assert secret not in out.output
    for f in Path(store.url.removeprefix("file://")).rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_single_answer_grading(tmp_path):
    with JudgeServer() as srv:
        store, data = sweep(tmp_path, srv.url, mode="single")
        assert report(store, data).exit_code == 0
        assert srv.hits == N_PROMPTS * 2  # every cell's answers, the baseline's too
    md = md_of(store, data)
    assert "1-10 grades" in md and "grade [95% CI]" in md


def test_the_report_shows_the_judges_agreement_with_imported_human_ratings(tmp_path):
    from tests.support.ratings import export, fill

    with JudgeServer() as srv:
        store, data = sweep(tmp_path, srv.url, mode="single", criteria=["fluency"])
        export(store, data, tmp_path / "sheets", items=12, raters=2, seed=3)
        for rater in ("r1", "r2"):
            (tmp_path / f"sheet-{rater}.csv").write_bytes(fill(tmp_path / "sheets" / f"sheet-{rater}.csv", rater))
        imported = CliRunner().invoke(main, ["rate", "import", data.sweep_id, str(tmp_path / "sheet-r1.csv"),
                                             str(tmp_path / "sheet-r2.csv"), "--store", store.url])  # fmt: skip
        assert imported.exit_code == 0, imported.output
        assert report(store, data).exit_code == 0
    md = md_of(store, data)
    assert "### Judge vs human raters" in md
    line = next(x for x in md.splitlines() if x.startswith("| fluency | Spearman"))
    n = int(line.rstrip(" |").rsplit("|", 1)[1])
    assert n >= 3  # the rated items the judge graded too
    # a summary recomputed in Python keeps both, reading what the report stored and sending nothing (they were gone)
    from controller.report.api import load_summary

    stored = load_summary(data.sweep_id, store=store)
    again = load_summary(data.sweep_id, store=store, recompute=True, n_boot=200)  # as the report was made
    kept = [c for c in stored.columns if c.startswith(("rating_", "judge_"))]
    assert "judge_fluency_grade" in kept and any(c.startswith("rating_") for c in kept)
    pd.testing.assert_frame_equal(again[["cell", *kept]], stored[["cell", *kept]], check_dtype=False)
    assert srv.hits == N_PROMPTS * 2  # the server's count when the report was made: nothing sent since


@pytest.mark.slow
def run_spec(tiny_model: str, name: str) -> dict:
    """A sweep `decodebench run` judges: the tiny model's greedy and top_k cells on three prompts (the judge added by
    each test)."""
    return {
        "name": name,
        "models": [{"path": tiny_model, "name": "tiny"}],
        "prompts": {"inline": ["It was the best of times", "Call me", "The house stood"]},
        "strategies": [{"name": "greedy"}, {"name": "top_k", "params": {"k": 20}}],
        "generation": {"max_new_tokens": 6, "batch_size": 4},
        "metrics": ["mean_length"],
    }


def test_run_over_the_judge_budget_writes_the_report_and_a_raised_limit_reports_the_same_sweep(tmp_path, tiny_model):
    """A run stopped by judge.limits wrote no report, and raising the limit as the error said made a new sweep id:
    every generation ran again. Now the report is written without the verdicts, the run exits 2 on the line, and the
    raised limit reports the same sweep, its jobs kept."""
    spec = run_spec(tiny_model, "judged-budget")
    runs = str(tmp_path / "runs")
    with JudgeServer() as srv:
        spec["judge"] = {"url": srv.url, "model": "stand-in", "baseline": "greedy", "limits": {"max_requests": 4}}
        (tmp_path / "s.json").write_text(json.dumps(spec))
        over = CliRunner().invoke(main, ["run", str(tmp_path / "s.json"), "--out", runs])
        assert over.exit_code == 2, over.output
        assert over.output.strip().splitlines()[-1].startswith("error: judge: 6 requests") and srv.hits == 0
        (md,) = (tmp_path / "runs").rglob("summary.md")
        assert "## Overview" in md.read_text() and "Not judged" in md.read_text()
        spec["judge"]["limits"]["max_requests"] = 6
        (tmp_path / "s.json").write_text(json.dumps(spec))
        again = CliRunner().invoke(main, ["run", str(tmp_path / "s.json"), "--out", runs])
        assert again.exit_code == 0, again.output
        assert "0 jobs run, 2 already complete" in again.output and srv.hits == 6
    assert "Not judged" not in md.read_text() and "## LLM judge" in md.read_text()


def test_a_sweep_submitted_again_with_a_raised_limit_is_reported_with_it(tmp_path, tiny_model, conn):
    """spec.json is written once, and the judge's limits are not part of the sweep id: a sweep submitted again with a
    raised limit kept its first limits, so `report SWEEP` stayed over budget for ever. Now the last run's or
    submission's limits are stored, and the report reads them."""
    from controller.launch.submit import submit
    from controller.sweep.load import load_spec
    from worker.store import open_store

    spec = run_spec(tiny_model, "judged-resubmit")
    runs = str(tmp_path / "runs")
    with JudgeServer() as srv:
        spec["judge"] = {"url": srv.url, "model": "stand-in", "baseline": "greedy", "limits": {"max_requests": 4}}
        (tmp_path / "s.json").write_text(json.dumps(spec))
        assert CliRunner().invoke(main, ["run", str(tmp_path / "s.json"), "--out", runs]).exit_code == 2
        spec["judge"]["limits"]["max_requests"] = 6
        (tmp_path / "s.json").write_text(json.dumps(spec))
        store = open_store(runs)
        out = submit(conn, store, load_spec(tmp_path / "s.json"), "default", key=b"k" * 32)
        again = CliRunner().invoke(main, ["report", out.sweep_id, "--store", runs, "--no-progress"])
        assert again.exit_code == 0, again.output
        assert srv.hits == 6
        assert store.load_spec("default", out.sweep_id)["spec"]["judge"]["limits"]["max_requests"] == 6


@pytest.mark.slow
def test_decodebench_run_with_a_judge_url_reports_its_win_rates(tmp_path, tiny_model):
    spec = run_spec(tiny_model, "judged-run")
    with JudgeServer() as srv:
        spec["judge"] = {"url": srv.url, "model": "stand-in", "baseline": "greedy"}
        (tmp_path / "s.json").write_text(json.dumps(spec))
        out = CliRunner().invoke(main, ["run", str(tmp_path / "s.json"), "--out", str(tmp_path / "runs")])
        assert out.exit_code == 0, out.output
        assert srv.hits == 3 * 2  # three prompts, both orders
    (md,) = (tmp_path / "runs").rglob("summary.md")
    assert "## LLM judge" in md.read_text() and "top_k" in md.read_text().split("## LLM judge")[1]


def test_an_endpoint_not_declared_where_the_report_runs_leaves_failures_not_a_broken_report(tmp_path, monkeypatch):
    monkeypatch.delenv("DECODEBENCH_TENANTS_FILE", raising=False)
    store = FileStore(tmp_path / "store")
    data = make_sweep(n_prompts=N_PROMPTS, cells=CELLS)
    data.spec["judge"] = {"endpoint": "big-judge", "model": "m", "baseline": "greedy"}
    write_with_hashes(store, data)
    out = report(store, data)
    assert out.exit_code == 0, out.output
    recs = verdicts(store, data)
    assert {r["outcome"] for r in recs} == {"failed"} and "'big-judge' is not declared here" in recs[0]["failure"]
    line = next(x for x in md_of(store, data).splitlines() if "top_p" in x and "| overall |" in x)
    assert line.rstrip(" |").endswith(f"| 0 | {N_PROMPTS}")


def test_every_sample_of_a_sampled_variant_is_judged_and_rated_by_its_own_key(tmp_path):
    from tests.support.ratings import export

    with JudgeServer() as srv:
        store = FileStore(tmp_path / "store")
        data = make_sweep(n_prompts=N_PROMPTS, cells=CELLS)
        data.spec["judge"] = {"url": srv.url, "model": "stand-in", "baseline": "greedy"}
        twice = [g for g in data.generations if "top_p" in g.cell]  # top_p with samples: 2, a second sample each
        data.generations += [g.model_copy(update={"sample": 1, "text": g.text + " once more, other words"})
                             for g in twice]  # fmt: skip
        write_with_hashes(store, data)
        assert report(store, data).exit_code == 0
        assert srv.hits == N_PROMPTS * 2 * 2  # before: N_PROMPTS * 2, the second samples never asked
        key = export(store, data, tmp_path / "sheets", items=30, raters=1, seed=1)
    recs = verdicts(store, data)
    assert sorted(r["sample"] for r in recs) == [0] * N_PROMPTS + [1] * N_PROMPTS
    assert {(r["baseline_job_seed"], r["baseline_sample"]) for r in recs} == {(0, 0)}  # greedy's only answer
    # the rating key names each item's sample, so a rating meets the answer the judge saw
    drawn = [w for w in key["items"].values() if "top_p" in w["cell"]]
    assert {w["sample"] for w in drawn} == {0, 1}
