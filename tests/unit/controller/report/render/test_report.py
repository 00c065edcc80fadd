"""Report formats, the Markdown table, the `report` command and `compare`."""

from __future__ import annotations

import io
import json
import math
import warnings

import pandas as pd
import pytest
from click.testing import CliRunner

from controller.cli import Group
from controller.cli.report import report
from controller.cli.table import echo_summary
from controller.report.compute.aggregate import summarize
from controller.report.compute.columns import DESIGN_COLUMNS, REFERENCE
from controller.report.render.format import markdown_table, small_sample_note, summary_markdown
from controller.report.render.html import mark_repeats, pareto_front, render_html
from controller.report.render.write import write_reports
from tests.support.report import make_sweep, write_sweep
from worker.core import paths
from worker.store import FileStore

pytestmark = pytest.mark.pure

HOSTILE = "<script>alert('pwned')</script> & \"quotes\""


def cli():
    """The command under a group that turns DecodebenchError into one line and its exit code."""
    return Group(commands={"report": report})


@pytest.fixture(scope="module")
def sweep():
    data = make_sweep(seeds=(0, 1), n_prompts=8)
    data.generations[0] = data.generations[0].model_copy(update={"text": HOSTILE + " the cat sat the cat sat"})
    return data, summarize(data, n_boot=100, n_boot_corpus=10)


def test_every_format_is_written_and_reads_back(tmp_path, sweep):
    data, summary = sweep
    store = FileStore(tmp_path)
    keys = write_reports(store, data.tenant, data.sweep_id, summary, data)
    assert set(keys) == {"csv", "parquet", "json", "md", "html"}
    for fmt, key in keys.items():
        assert key == paths.report_key(data.tenant, data.sweep_id, paths.REPORT_FILES[fmt])
    csv = pd.read_csv(io.BytesIO(store.read_bytes(keys["csv"])))
    assert list(csv.columns) == list(summary.columns)
    assert csv["tokens_per_s"].tolist()[:2] == pytest.approx(summary["tokens_per_s"].tolist()[:2])
    assert math.isnan(csv.loc[csv["strategy"] == REFERENCE, "tokens_per_s"].iloc[0])
    parquet = pd.read_parquet(io.BytesIO(store.read_bytes(keys["parquet"])))
    assert list(parquet.columns) == list(summary.columns)
    assert parquet["distinct_2"].tolist() == pytest.approx(summary["distinct_2"].tolist(), nan_ok=True)
    doc = json.loads(store.read_bytes(keys["json"]))
    assert doc["sweep_id"] == data.sweep_id and doc["columns"] == list(summary.columns)
    assert doc["ci"]["unit"] == "prompt" and doc["ci"]["prompts"] == 8
    frame = pd.DataFrame(doc["rows"], columns=doc["columns"])
    assert frame["rep_2"].tolist() == pytest.approx(summary["rep_2"].tolist(), nan_ok=True)
    assert doc["rows"][-1]["tokens_per_s"] is None  # empty, not 0
    md = store.read_bytes(keys["md"]).decode()
    assert "| model | strategy |" in md and "reference" in md and "[" in md  # intervals shown
    page = store.read_bytes(keys["html"]).decode()
    assert page.startswith("<!DOCTYPE html>") and "<script src" not in page.lower()
    caution = "The smallest cell has 8 prompts: below 32, an interval can cover less than 95%"
    assert caution in md and caution in page  # 8 prompts: fewer than the intervals were calibrated at
    declared = "fewer than the 64 prompts at which distinct_3&#x27;s interval was calibrated"
    assert declared.replace("&#x27;", "'") in md and declared in page


def test_the_small_sample_caution_only_below_the_calibrated_prompts(capsys, sweep):
    _, summary = sweep
    ci = summary.attrs["ci"]
    assert ci["calibrated"] == {"distinct_3": 64}  # declared by the metric (Metric.calibrated_prompts)
    assert small_sample_note({**ci, "prompts": 64}) is None and small_sample_note(None) is None
    assert small_sample_note({**ci, "prompts": 32, "calibrated": {}}) is None  # a sweep without distinct_3
    at_32 = small_sample_note({**ci, "prompts": 32})
    assert at_32.startswith("The smallest cell has 32 prompts, fewer than the 64 prompts at which distinct_3's")
    assert "below 32" not in at_32
    at_31 = small_sample_note({**ci, "prompts": 31})
    assert "has 31 prompts: below 32" in at_31 and "It is fewer than the 64 prompts at which distinct_3's" in at_31
    two = small_sample_note({**ci, "prompts": 40, "calibrated": {"distinct_3": 64, "plugin": 48, "bad": "9"}})
    assert "these metrics' intervals were calibrated (distinct_3 64, plugin 48): with fewer they" in two
    # the terminal names only the columns it prints (its table leaves distinct_3 to the report)
    assert small_sample_note({**ci, "prompts": 32}, ["rep_4"]) is None
    assert "distinct_3" in small_sample_note({**ci, "prompts": 32}, ["rep_4", "distinct_3"])
    echo_summary(summary)
    out, err = capsys.readouterr()
    assert "| model | strategy |" in out and "The smallest cell has 8 prompts" in err and "8 prompts" not in out
    assert "distinct_3" not in err and "distinct_3" not in out  # not among the columns printed


def test_html_escapes_every_text(sweep):
    data, summary = sweep
    page = render_html(summary, data)
    assert HOSTILE not in page and "alert('pwned')" not in page
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    assert "Prompt number 0 &lt;b&gt;&amp;" in page
    assert "<mark>" in page


def test_mark_repeats_marks_second_occurrence_and_escapes():
    out = mark_repeats("The cat sat <on> the cat sat.")
    assert out == "The cat sat &lt;on&gt; <mark>the cat sat</mark>."
    assert mark_repeats("no repeats here at all") == "no repeats here at all"


def test_pareto_front():
    xs, ys = [1.0, 2.0, 3.0, 2.5], [0.9, 0.8, 0.1, 0.5]
    assert pareto_front(xs, ys, y_higher_is_better=True) == [0, 1, 3, 2]
    assert pareto_front([1.0, 2.0], [0.5, 0.4], y_higher_is_better=False) == [1]


def test_markdown_table_is_concise_and_leaves_missing_empty(sweep):
    _, summary = sweep
    md = markdown_table(summary)
    header = md.splitlines()[0]
    assert header.startswith("| model | strategy | n | tok/s |")  # the strategy column: the variant's label
    assert "rouge_2" not in header  # not among the concise columns
    ref = [line for line in md.splitlines() if "| reference |" in line][0]
    assert "|  |" in ref and "| 0 |" not in ref.replace("| 0.", "")
    assert "| austen-tiny | top_p |" in md and "temperature" not in md  # p=0.9, temperature=1.0: the defaults
    full = markdown_table(summary, DESIGN_COLUMNS)
    assert "rouge_2" in full.splitlines()[0]
    assert "| top_p | p=0.9, temperature=1.0 |" in full  # every parameter, in the params column


def test_report_command_writes_all_and_prints_markdown(tmp_path, monkeypatch):
    data = make_sweep(n_prompts=4)
    write_sweep(FileStore(tmp_path / "runs"), data)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "exports" / "summary.csv"
    result = CliRunner().invoke(
        cli(), ["report", data.sweep_id[:8], "--store", str(tmp_path / "runs"), "--format", "csv", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("| model | strategy |")
    report_dir = tmp_path / "runs" / "default" / "sweeps" / data.sweep_id / "report"
    # beside the formats, the report cache: here only the results snapshot (controller.report.load.snapshot)
    assert sorted(p.name for p in report_dir.iterdir()) == sorted([*paths.REPORT_FILES.values(), "cache"])
    assert [p.name for p in (report_dir / "cache").iterdir()] == ["results.jsonl.gz"]
    assert out.read_bytes() == (report_dir / "summary.csv").read_bytes()


def test_report_command_reads_store_and_tenant_from_env(tmp_path, monkeypatch):
    data = make_sweep(n_prompts=4, tenant="team-a")
    write_sweep(FileStore(tmp_path), data)
    monkeypatch.setenv("DECODEBENCH_STORE", str(tmp_path))
    monkeypatch.setenv("DECODEBENCH_TENANT", "team-a")
    argv = ["report", data.sweep_id, "--format", "json", "--output", str(tmp_path / "s.json")]
    result = CliRunner().invoke(cli(), argv)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "s.json").read_text())["tenant"] == "team-a"


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "nosuchsweep"], "no sweep 'nosuchsweep'"),
        (["report", "sweep0000000000a", "--tenant", "bad tenant"], "tenant 'bad tenant'"),
    ],
)
def test_report_command_user_errors_are_one_line(tmp_path, args, message):
    result = CliRunner().invoke(cli(), args + ["--store", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_report_command_without_complete_jobs(tmp_path):
    data = make_sweep(n_prompts=2)
    store = FileStore(tmp_path)
    store.write_json(paths.spec_key(data.tenant, data.sweep_id), data.spec)
    result = CliRunner().invoke(cli(), ["report", data.sweep_id, "--store", str(tmp_path)])
    assert result.exit_code == 2 and "no complete jobs" in result.stderr


def test_a_baseline_the_sweep_does_not_have_is_one_line_not_a_report_without_comparisons(tmp_path):
    """`--baseline` with a typo gave a report whose cells were compared with nothing, and said nothing."""
    data = make_sweep(n_prompts=8)
    store = FileStore(tmp_path)
    write_sweep(store, data)
    argv = ["report", data.sweep_id, "--store", str(tmp_path), "--n-boot", "50", "--no-progress"]
    bad = CliRunner().invoke(cli(), [*argv, "--baseline", "gredy"])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1, bad.output
    assert bad.stderr.startswith("error: --baseline 'gredy': no strategy or cell of this sweep has that name (its")
    assert not store.exists(paths.report_key(data.tenant, data.sweep_id, "summary.csv"))  # nothing written
    cell = summarize(data, n_boot=50).loc[0, "cell"]
    for good in ("greedy", cell):  # a strategy, a cell key
        assert CliRunner().invoke(cli(), [*argv, "--baseline", good]).exit_code == 0


def test_too_few_replicates_for_a_p_value_are_one_line(tmp_path):
    """`--n-boot 3` gave every comparison p = 0.25 (1 / (3 + 1)) whatever the difference: 0 or at least 10."""
    data = make_sweep(n_prompts=8)
    store = FileStore(tmp_path)
    write_sweep(store, data)
    argv = ["report", data.sweep_id, "--store", str(tmp_path), "--no-progress", "--n-boot"]
    bad = CliRunner().invoke(cli(), [*argv, "3"])
    assert bad.exit_code == 2 and bad.stderr == (
        "error: --n-boot 3: too few bootstrap replicates for an interval or a p-value (at least 10; the default is"
        " 1000), or 0 for none\n"
    )
    assert all(CliRunner().invoke(cli(), [*argv, n]).exit_code == 0 for n in ("0", "10"))


def test_report_compare(tmp_path):
    store = FileStore(tmp_path)
    a = make_sweep(n_prompts=4, sweep_id="sweepaaaaaaaaaaa")
    b = make_sweep(n_prompts=4, sweep_id="sweepbbbbbbbbbbb")
    for r in b.results:
        for batch in r.batches:
            batch.total_s *= 2  # B is twice as slow
    write_sweep(store, a)
    write_sweep(store, b)

    def compare(fmt: str, out: str):
        argv = ["report", a.sweep_id, "--compare", b.sweep_id, "--store", str(tmp_path), "--format", fmt]
        return CliRunner().invoke(cli(), [*argv, "--out", str(tmp_path / out)])

    result = compare("csv", "cmp.csv")
    assert result.exit_code == 0, result.output
    assert "Δ tok/s" in result.stdout.splitlines()[0]
    cmp = pd.read_csv(tmp_path / "cmp.csv")
    greedy = cmp[cmp["strategy"] == "greedy"].iloc[0]
    assert greedy["tokens_per_s_delta"] < 0 and greedy["distinct_2_delta"] == 0
    assert store.exists(paths.report_key(a.tenant, a.sweep_id, f"compare-{b.sweep_id}.csv"))
    bad = compare("html", "x.html")
    assert bad.exit_code == 2


def test_api_loads_summary_and_generations(tmp_path):
    from controller.report.api import load_generations, load_summary

    store = FileStore(tmp_path)
    data = make_sweep(n_prompts=4, shard_size=2)
    write_sweep(store, data)
    fresh = load_summary(data.sweep_id[:6], store=str(tmp_path), n_boot=0)
    assert list(fresh.columns[: len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS
    gens = load_generations(data.sweep_id, store=store)
    assert len(gens) == len(data.generations) and {"text", "prompt_id", "strategy", "job_seed"} <= set(gens.columns)
    # A written report is read back as long as it covers every complete job ...
    stale = fresh.copy()
    stale["tokens_per_s"] = -1.0
    write_reports(store, data.tenant, data.sweep_id, stale, data, formats=("parquet",))
    assert (load_summary(data.sweep_id, store=store)["tokens_per_s"] == -1.0).all()
    # ... and recomputed when a job completed since.
    store.delete(paths.result_key(data.tenant, data.sweep_id, data.results[0].job.job_id))
    assert (load_summary(data.sweep_id, store=store, n_boot=0)["tokens_per_s"].dropna() > 0).all()


def test_a_column_added_to_a_loaded_summary_raises_no_fragmentation_warning(tmp_path):
    """The notebook's first cell adds a label to `load_summary`'s frame: pandas warned that the frame was "highly
    fragmented" (one block per column, 200 of them, from the summary's dtypes set column by column)."""
    from controller.report.api import load_summary

    store = FileStore(tmp_path)
    data = make_sweep(n_prompts=8)
    write_sweep(store, data)
    summary = load_summary(data.sweep_id, store=store, n_boot=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        summary["label"] = summary["strategy"]
    assert summary.attrs["ci"]["n_boot"] == 20  # the copy keeps what the summary says of itself


def test_the_report_names_the_models_behind_model_based_metrics():
    """Perplexity, coherence and MAUVE compare only under the same scorer and featurizer: the report says which."""
    from controller.report.render.format import model_based_metrics

    data = make_sweep()
    assert model_based_metrics(data) == "Perplexity and coherence scored by each cell's own model."
    data.spec["scorer"] = {"path": "/models/judge-7b"}
    data.spec["featurizer"] = {"path": "/models/gpt2-large", "name": "gpt2-large"}
    data.spec["featurizer_max_tokens"] = 512
    text = model_based_metrics(data)
    assert text == ("Perplexity and coherence scored by judge-7b. MAUVE features from gpt2-large (at most 512 tokens).")
    assert text in render_html(summarize(data, n_boot=0), data)  # html.escape leaves this text as it is
    assert text in summary_markdown(summarize(data, n_boot=0), data)


def test_sweeps_with_samples_compare_and_label_their_cells():
    """A sweep with `samples` had its cells without samples keyed by a blank for the merge, and the blank reached
    the labels: `report A --compare B` failed with int('') for any such sweep, even compared with itself."""
    from controller.report.compute.compare import compare
    from controller.report.render.format import compare_table

    def summary(accuracy: list[float], samples: list[float | None]) -> pd.DataFrame:
        return pd.DataFrame(
            {"model": ["m", "m", "m"], "strategy": ["greedy", "sample", "sample"], "params": ["{}", "{}", "{}"],
             "samples": samples, "best_of": [None, None, "model"], "exact_match": accuracy}
        )  # fmt: skip

    a = summary([0.9, 0.6, 0.8], [None, 8.0, 8.0])
    cmp = compare(a, summary([0.9, 0.7, 0.8], [None, 8.0, 8.0]))
    assert list(cmp["present"]) == ["both"] * 3 and cmp["exact_match_delta"].round(6).tolist() == [0.0, 0.1, 0.0]
    assert cmp["samples"].isna().tolist() == [True, False, False] and cmp["best_of"].isna().tolist()[:2] == [True] * 2
    table = compare_table(cmp)
    for label in ("| greedy |", "| sample[samples=8] |", "| sample[best_of=8,by=model] |"):
        assert label in table, table
    assert "| Δ exact_match |" in table.splitlines()[0]  # a task sweep's accuracy, as in its overview
    without = a.iloc[:1].drop(columns=["samples", "best_of"])  # B a sweep without samples: its greedy matches A's
    one_sided = compare(a, without)
    assert list(one_sided["present"]) == ["both", "a", "a"] and "| sample[samples=8] | a |" in compare_table(one_sided)


def test_an_example_card_without_cached_examples_shows_the_first_sample():
    """The cards built from the generations (no cell examples) kept a prompt's last sample: sorted by seed alone,
    the later samples of the lowest seed overwrote its first. Now the lowest seed's first sample, as the cells' own
    examples."""
    from controller.report.render.html import examples

    data = make_sweep(n_prompts=8)
    summary = summarize(data)
    data.examples = {}
    first = data.generations[0]
    data.generations.append(first.model_copy(update={"sample": 1, "text": "a later sample's words"}))
    html = examples(summary, data)
    assert "a later sample" not in html and first.text.split()[0] in html
