"""The judge's protocol against a real HTTP server on loopback: retries, Retry-After, failures, parsing, templates."""

from __future__ import annotations

import json

import pytest

from controller.judge.client import Endpoint, complete, read_key, retry_after
from controller.judge.templates import load_template, parse_template
from controller.judge.verdicts import Verdict, combine_orders, parse_grade, parse_pairwise
from controller.sweep.judgespec import JudgeLimits
from tests.support.judge import JudgeServer
from worker.core.errors import UsageError

BODY = {"model": "judge", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 8}


def ok(text: str) -> tuple[int, dict, bytes, float]:
    doc = {"choices": [{"message": {"role": "assistant", "content": text}}], "usage": {"total_tokens": 7}}
    return 200, {}, json.dumps(doc).encode(), 0.0


def limits(**kw) -> JudgeLimits:
    return JudgeLimits(**{"retries": 3, "timeout_s": 5, **kw})


def test_429_is_retried_after_the_servers_retry_after_and_500_with_backoff():
    slept: list[float] = []
    script = [(429, {"Retry-After": "7"}, b"{}", 0), (500, {}, b"oops", 0), ok("[[A]]")]
    with JudgeServer(script) as srv:
        (reply,) = complete(Endpoint(srv.url), [BODY], limits(), sleep=slept.append)
    assert reply == ("[[A]]", 7)
    assert srv.hits == 3
    assert slept == [7.0, 2.0]  # Retry-After honoured, then exponential backoff (1, 2, 4 …) for the 500


def test_retries_run_out_into_a_failure_with_its_reason_not_an_exception():
    with JudgeServer([(503, {}, b"", 0)] * 3) as srv:
        (reply,) = complete(Endpoint(srv.url), [BODY], limits(retries=2), sleep=lambda s: None)
    assert reply[0] is None and "HTTP 503 after 3 tries" in reply[1]
    assert srv.hits == 3


def test_a_4xx_other_than_429_is_not_retried():
    with JudgeServer([(400, {}, b"{}", 0)]) as srv:
        (reply,) = complete(Endpoint(srv.url), [BODY], limits(), sleep=lambda s: None)
    assert reply == (None, "HTTP 400") and srv.hits == 1


def test_a_timeout_is_a_recorded_failure():
    with JudgeServer([(200, {}, b"{}", 3.0)]) as srv:
        (reply,) = complete(Endpoint(srv.url), [BODY], limits(timeout_s=0.3, retries=0), sleep=lambda s: None)
    assert reply[0] is None and "timed out" in reply[1]


def test_malformed_json_is_a_recorded_failure():
    with JudgeServer([(200, {}, b"{not json", 0), (200, {}, b'{"choices": []}', 0)]) as srv:
        replies = complete(Endpoint(srv.url), [BODY, BODY], limits(concurrency=1), sleep=lambda s: None)
    assert all(text is None and "malformed response" in why for text, why in replies)


def test_the_time_budget_stops_retrying():
    with JudgeServer([(429, {"Retry-After": "30"}, b"{}", 0)]) as srv:
        (reply,) = complete(Endpoint(srv.url), [BODY], limits(time_budget_s=5), sleep=lambda s: None)
    assert reply[0] is None and "time budget" in reply[1] and srv.hits == 1


def test_the_key_is_sent_as_a_bearer_token_and_never_shown(tmp_path, monkeypatch):
    (tmp_path / "key").write_text("sk-secret-123\n")
    key = read_key(None, str(tmp_path / "key"))
    endpoint = Endpoint("http://127.0.0.1:9/v1", key)
    assert "sk-secret" not in repr(endpoint) and "sk-secret" not in str(endpoint)
    with JudgeServer() as srv:
        complete(Endpoint(srv.url, key), [BODY], limits())
    assert srv.auth == ["Bearer sk-secret-123"]
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(UsageError, match="NO_SUCH_JUDGE_KEY") as err:
        read_key("NO_SUCH_JUDGE_KEY", None)
    assert "\n" not in str(err.value)


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after("3") == 3.0 and retry_after(None) is None and retry_after("soon") is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: now


def test_verdict_parsing_records_unparsed_never_a_tie():
    assert parse_pairwise("A is better. [[A]]") is Verdict.A
    assert parse_pairwise("[[A]] hmm, on reflection [[B]]") is Verdict.B  # the last word counts
    assert parse_pairwise("It is a tie: [[C]]") is Verdict.TIE
    for bad in ("A is better", "[[D]]", "", None, "[A]"):
        assert parse_pairwise(bad) is Verdict.UNPARSED
    assert parse_grade("Rating: [[7]]") == 7.0 and parse_grade("[[11]]") is None and parse_grade("seven") is None


def test_position_swap_and_the_tie_rule():
    # `first`: the variant shown as A; `swapped`: the variant shown as B
    assert combine_orders(Verdict.A, Verdict.B) is Verdict.A  # preferred in both orders: a win
    assert combine_orders(Verdict.B, Verdict.A) is Verdict.B  # the baseline preferred in both: a loss
    assert combine_orders(Verdict.A, Verdict.A) is Verdict.TIE  # the first shown always wins: flips, a tie
    assert combine_orders(Verdict.B, Verdict.B) is Verdict.TIE
    assert combine_orders(Verdict.A, Verdict.TIE) is Verdict.TIE  # a win in one order only: a tie
    assert combine_orders(Verdict.UNPARSED, Verdict.B) is Verdict.UNPARSED  # never silently a tie
    assert combine_orders(Verdict.A, Verdict.FAILED) is Verdict.FAILED


def test_templates_are_versioned_files_with_a_hash_and_placeholders_filled_literally(tmp_path):
    t = load_template("pairwise")
    assert t.name == "pairwise-v1.txt" and len(t.sha256) == 64
    msgs = t.messages("fluency", "Once {prompt}", ("text with {answer_b} inside", "other"))
    assert "text with {answer_b} inside" in msgs[1]["content"] and "fluency" in msgs[0]["content"]
    assert msgs[1]["content"].index("text with") < msgs[1]["content"].index("other")
    with pytest.raises(UsageError, match="needs \\{answer_b\\}"):
        parse_template("mine.txt", b"sys\n=== user ===\n{prompt} {answer_a}", "pairwise")
    (tmp_path / "mine.txt").write_text("Judge {criterion}.\n=== user ===\n{prompt}\n{answer}\n")
    mine = load_template("single", str(tmp_path / "mine.txt"))
    assert mine.sha256 != load_template("single").sha256
