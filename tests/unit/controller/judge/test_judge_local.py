"""A local-model judge: the bundled model loaded by the report and decoded greedily by the own engine.

Its verdicts are meaningless (a 256-position model trained on Austen), but the path is the real one:
the engine's greedy job, the same parsing (mostly "unparsed", counted), the cache (a second report
has nothing to send) and the report's section."""

from __future__ import annotations

from click.testing import CliRunner

from controller.cli import main
from tests.support.repo import REPO
from tests.support.report import make_sweep, write_with_hashes
from worker.core import paths
from worker.store import FileStore

MODEL = str(REPO / "examples" / "models" / "austen-tiny")
CELLS = [("austen-tiny", "greedy", {}), ("austen-tiny", "top_p", {"p": 0.9})]


def test_a_local_model_judges_through_the_own_engine_and_its_replies_are_cached(tmp_path):
    (tmp_path / "short.txt").write_text("Which is better for {criterion}?\n=== user ===\n{prompt}\nA: {answer_a}\n"
                                        "B: {answer_b}\n")  # fmt: skip  # short: the bundled model has 256 positions
    store = FileStore(tmp_path / "store")
    data = make_sweep(n_prompts=2, cells=CELLS)
    data.spec["judge"] = {"local": {"path": MODEL}, "template": str(tmp_path / "short.txt"), "max_new_tokens": 6}
    write_with_hashes(store, data)
    args = ["report", data.sweep_id, "--store", store.url, "--no-progress", "--n-boot", "50"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    recs = list(store.read_jsonl(paths.report_key(data.tenant, data.sweep_id, paths.JUDGE_VERDICTS_FILE)))
    assert len(recs) == 2 and all(r["judge"].startswith("local:") for r in recs)
    assert all(r["outcome"] in ("A", "B", "tie", "unparsed") for r in recs)  # answered, never failed
    assert "## LLM judge" in store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "summary.md")).decode()
    again = CliRunner().invoke(main, [*args, "--dry-run"])
    assert again.exit_code == 0 and "4 requests, 4 cached, 0 to send" in again.output
