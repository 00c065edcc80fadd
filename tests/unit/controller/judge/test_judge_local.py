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


def test_a_request_too_long_for_the_local_judge_fails_alone_and_the_report_is_written(tmp_path):
    """The bundled template and two answers are over austen-tiny's 256 positions. Before, the engine's refusal of
    the whole job stopped the report (exit 1, no summary) where an endpoint's 4xx would have been a failed verdict;
    now each such request is a failed verdict naming the positions, a request that fits is answered beside it, and
    the report is written with the failures counted, said once on the console."""
    from controller.judge.local import complete_local
    from controller.sweep.judgespec import JudgeSpec

    judge = JudgeSpec.model_validate({"local": {"path": MODEL}, "max_new_tokens": 6})
    long = {"messages": [{"role": "user", "content": "the house " * 200}]}
    short = {"messages": [{"role": "user", "content": "Which is better?"}]}
    (text_long, why), (text_short, tokens) = complete_local(judge, [long, short])
    assert text_long is None and "too long for the judge" in why and "256 positions" in why
    assert isinstance(text_short, str) and isinstance(tokens, int) and tokens <= 6
    store = FileStore(tmp_path / "store")
    data = make_sweep(n_prompts=2, cells=CELLS)
    data.spec["judge"] = {"local": {"path": MODEL}, "max_new_tokens": 6}  # the bundled template: too long
    write_with_hashes(store, data)
    args = ["report", data.sweep_id, "--store", store.url, "--no-progress", "--n-boot", "50"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    recs = list(store.read_jsonl(paths.report_key(data.tenant, data.sweep_id, paths.JUDGE_VERDICTS_FILE)))
    assert len(recs) == 2 and all(r["outcome"] == "failed" and "too long for the judge" in r["failure"] for r in recs)
    assert "judge: 2 of 2 verdicts failed (too long for the judge" in out.output
    summary = store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "summary.md")).decode()
    assert "## LLM judge" in summary and "| 0 | 2 |" in summary  # unparsed 0, failed 2


def test_a_chat_model_judges_the_messages_through_its_template(monkeypatch):
    """A chat judge is asked the request's system and user turns through its own template, as a server at a `url`
    would ask it; before, it got the flattened text as one user turn. A raw model still gets the text."""
    import worker.engine.job as engine_job
    from controller.judge.local import complete_local
    from controller.sweep.judgespec import JudgeSpec

    fed, real = [], engine_job.generate_job

    def watched(job, runtime):
        fed.append(job)
        return real(job, runtime)

    monkeypatch.setattr(engine_job, "generate_job", watched)
    body = {"messages": [{"role": "system", "content": "You judge."}, {"role": "user", "content": "A or B?"}]}
    for path, chats in ((MODEL, False), (str(REPO / "examples" / "models" / "austen-tiny-chat"), True)):
        judge = JudgeSpec.model_validate({"local": {"path": path}, "max_new_tokens": 6})
        ((text, tokens),) = complete_local(judge, [body])
        assert isinstance(text, str) and 0 <= tokens <= 6
        (item,) = fed.pop().prompts
        assert item.prompt == "You judge.\n\nA or B?\n\nVerdict:"
        if chats:
            assert [m.model_dump() for m in item.messages] == body["messages"]
        else:
            assert item.messages is None


def test_a_local_judges_cache_key_holds_its_files_hashed_once_per_report(tmp_path, monkeypatch):
    """Retraining the judge at the same path, or editing its chat template, asks its requests again: before, the key
    named only the path and revision and the stale verdicts were read from the cache."""
    import shutil
    from types import SimpleNamespace

    from controller.judge.run import items_of
    from controller.judge.templates import load_template
    from controller.sweep.judgespec import JudgeSpec
    from worker.engine import checkpoint

    model = tmp_path / "judge"
    shutil.copytree(REPO / "examples" / "models" / "austen-tiny-chat", model)
    judge = JudgeSpec.model_validate({"local": {"path": str(model)}})
    template = load_template("pairwise", None)
    answers = {c: {(f"p{i}", 0, 0): SimpleNamespace(prompt=f"prompt {i}", text=f"{c} {i}", job_seed=0, sample=0)
                   for i in range(3)} for c in ("b", "v")}  # fmt: skip
    hashed, real = [], checkpoint.content_hash  # the engine's own hasher, counted
    monkeypatch.setattr(checkpoint, "content_hash", lambda path, **how: hashed.append(path) or real(path, **how))

    def digests() -> set[str]:
        return {r.digest for it in items_of(judge, template, answers, {"b": None, "v": "b"}) for r in it.requests}

    before = digests()
    assert len(before) == 6 and len(hashed) == 1  # six requests, the model's files read once
    assert digests() == before  # the same files: the same keys, the cached replies
    config = model / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{% for message in messages %}", "{% for message in messages %} "))
    edited = digests()
    assert edited.isdisjoint(before)  # the chat template changed
    (model / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")  # a template in a file of its own
    jinja = digests()
    assert jinja.isdisjoint(edited)
    weights = model / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))  # retrained at the same path: other weights
    assert digests().isdisjoint(before | edited | jinja)
