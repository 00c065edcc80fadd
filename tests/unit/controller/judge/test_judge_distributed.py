"""The judge on the cluster (issue 41, item 4): `report --distributed` sends a declared endpoint's requests
from the report workers, as shares of the report's requests (controller.judge.jobs), against the stand-in
judge (tests/support/judge.py), a real redis-server, the moto S3 store and real `decodebench report-worker`
processes. Only the workers' tenants file declares the endpoint and only they can read its key: the
controller process has neither, so a request it sent would fail ("not declared here"), and the stand-in
server sees every request carry the workers' key."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from click.testing import CliRunner

from controller.cli import main as cli
from controller.report.compute.cache import ReportCache
from controller.report.distribute.mapworker import report_worker
from tests.support.judge import JudgeServer, verdict_for
from tests.support.report import make_sweep, write_with_hashes
from tests.support.reportworkers import plant, report_workers
from tests.support.services import SIGNING_KEY as KEY
from worker.core import keys, paths, rqadapter
from worker.store import open_store

pytestmark = pytest.mark.usefixtures("restore_signals")  # tests/conftest.py: the in-process report worker's handlers

CELLS = [("austen-tiny", "greedy", {}), ("austen-tiny", "top_p", {"p": 0.9}), ("austen-tiny", "top_k", {"k": 5})]
N_PROMPTS = 6
WORKER_KEY = "sk-only-the-report-workers-hold-this"


def tenants_file(tmp_path, url: str) -> str:
    """The operator's tenants file, as the chart mounts it in the report workers (the key a file beside it)."""
    key = tmp_path / "secrets" / "key"
    key.parent.mkdir()
    key.write_text(WORKER_KEY)
    doc = {
        "tenants": [{"name": "team-a", "judges": ["stand-in"]}, {"name": "team-b"}],
        "judges": [{"name": "stand-in", "url": url, "api_key_file": str(key)}],
    }
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def judge_jobs(conn, tenant: str = "team-a") -> int:
    return len(conn.keys(keys.rq_job_prefix(tenant) + "judge-*"))


def report(url: str, redis_url: str, sweep_id: str):
    args = [
        "report",
        sweep_id,
        "--tenant",
        "team-a",
        "--distributed",
        "--wait-s",
        "60",
        "--n-boot",
        "20",
        "--no-progress",
    ]
    return CliRunner().invoke(cli, [*args, "--store", url, "--redis-url", redis_url])


def test_the_report_workers_send_the_judge_requests_a_failed_one_is_asked_again_then_none(
    redis_url, s3_bucket, tmp_path, monkeypatch
):
    import redis

    conn = redis.Redis.from_url(redis_url)
    url = f"s3://{s3_bucket}/runs"
    store = open_store(url)
    data = make_sweep(n_prompts=N_PROMPTS, cells=CELLS, tenant="team-a")
    data.spec["judge"] = {"endpoint": "stand-in", "model": "stand-in", "baseline": "greedy",
                          "criteria": ["overall", "fluency"], "limits": {"concurrency": 3}}  # fmt: skip
    write_with_hashes(store, data)
    monkeypatch.delenv("DECODEBENCH_TENANTS_FILE", raising=False)  # the controller: no endpoint, no key
    verdicts = lambda: list(store.read_jsonl(paths.report_key(data.tenant, data.sweep_id, paths.JUDGE_VERDICTS_FILE)))
    slow = lambda messages: time.sleep(0.05) or verdict_for(messages)  # replies overlap: in flight is measured
    with JudgeServer(script=[(401, {}, b"{}", 0)], verdict=slow) as srv:  # the first request it gets is refused
        workers_env = {"DECODEBENCH_TENANTS_FILE": tenants_file(tmp_path, srv.url)}
        with report_workers(2, redis_url, url, env=workers_env):
            first = report(url, redis_url, data.sweep_id)
            assert first.exit_code == 0, first.output
            expected = N_PROMPTS * 2 * 2 * 2  # prompts x 2 compared cells x both orders x criteria
            assert srv.hits == expected and set(srv.auth) == {f"Bearer {WORKER_KEY}"}  # every one from a worker
            assert judge_jobs(conn) == 2  # min(concurrency, compared cells) shares of whole cells, one job each
            assert srv.peak <= 3  # limits.concurrency for the report, whichever workers sent the shares
            # the refused request is a failed verdict with the worker's reason (the controller cannot send it)
            (failed,) = [r for r in verdicts() if "failure" in r]
            assert (
                failed["outcome"] == "failed"
                and "report worker: judge: 1 of 24 requests failed (HTTP 401)" in (failed["failure"])
            )

            again = report(url, redis_url, data.sweep_id)
            assert again.exit_code == 0, again.output
            assert srv.hits == expected + 1  # only the failed request is asked again, by a worker, of its share
            third = report(url, redis_url, data.sweep_id)
            assert third.exit_code == 0, third.output
            assert srv.hits == expected + 1 and judge_jobs(conn) == 2  # all cached: no share asked for, nothing sent
    assert set(srv.auth) == {f"Bearer {WORKER_KEY}"}
    recs = verdicts()
    assert len(recs) == N_PROMPTS * 2 * 2 and not [r for r in recs if "failure" in r]
    md = store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "summary.md")).decode()
    summary = json.loads(store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "summary.json")))
    for cell in ("austen-tiny::top_p(p=0.9)", "austen-tiny::top_k(k=5)"):
        overall = [r for r in recs if r["cell"] == cell and r["criterion"] == "overall"]
        win = sum({"A": 1, "tie": 0.5, "B": 0}[r["outcome"]] for r in overall) / len(overall)
        row = next(r for r in summary["rows"] if r["cell"] == cell)
        assert row["judge_overall_win_rate"] == pytest.approx(win) and f"{win:.3f} [" in md
    assert "## LLM judge" in md and "LC win rate" in md
    for key in store.list(paths.report_key(data.tenant, data.sweep_id, "")):  # the key is written nowhere
        assert WORKER_KEY.encode() not in store.read_bytes(key), key


def forged(mine: dict, theirs: dict, cells: list[str], judge_url: str) -> dict[str, tuple[str, dict, str]]:
    """Signed judge payloads a client with Redis access could plant: {job id: (tenant, payload, the refusal)}."""
    return {
        # team-b's own sweep and a signed payload, but team-b may use no endpoint
        "team-b": ("team-b", theirs, "refused: tenant 'team-b' may not use judge endpoint 'stand-in'"),
        "undeclared": ("team-a", mine | {"endpoint": "big-judge"}, "judge endpoint 'big-judge' is not declared"),
        "url": ("team-a", mine | {"endpoint": "http://evil:80/v1"}, "is not declared here"),
        "not-the-sweeps": ("team-a", mine | {"share_digest": "0" * 32}, "requests changed since"),
        # a share's cells: names, of the sweep, whose requests the digest was taken over
        "cells-not-names": ("team-a", mine | {"cells": "austen-tiny::greedy"}, "cells are not a list of cell"),
        "cell-twice": ("team-a", mine | {"cells": [*cells, *cells]}, "names a cell twice"),
        "not-its-cells": (
            "team-a",
            mine | {"cells": ["austen-tiny::nope"], "share_digest": "2" * 32},  # its own failure mark
            "cells are not the sweep's cells",
        ),
        "baseline-only": (
            "team-a",
            mine | {"cells": ["austen-tiny::greedy"], "share_digest": "3" * 32},
            "requests changed since",
        ),
        "more-shares": ("team-a", mine | {"shares": 99, "concurrency": 99}, "more than the sweep's"),
        "late": (
            "team-a",
            mine | {"deadline": time.time() + 10**6, "share_digest": "1" * 32},
            "past the sweep's judge.limits.time_budget_s",
        ),
        "extra-field": ("team-a", mine | {"url": judge_url}, "the judge job's fields are not"),
    }


def test_a_judge_payload_naming_an_endpoint_its_tenant_may_not_use_is_refused(redis_url, tmp_path, monkeypatch):
    import redis

    from controller.judge.jobs import JudgeJob, cut, share_name, share_requests
    from controller.judge.run import plan_sweep

    conn = redis.Redis.from_url(redis_url)
    store = open_store(str(tmp_path / "s"))
    judge = {"endpoint": "stand-in", "model": "stand-in", "baseline": "greedy"}
    for tenant, sweep_id in (("team-a", "sweepaaaaaaaaaaa"), ("team-b", "sweepbbbbbbbbbbb")):
        data = make_sweep(n_prompts=N_PROMPTS, cells=CELLS[:2], tenant=tenant, sweep_id=sweep_id)
        data.spec["judge"] = judge
        write_with_hashes(store, data)
    with JudgeServer() as srv:
        monkeypatch.setenv("DECODEBENCH_TENANTS_FILE", tenants_file(tmp_path, srv.url))
        judge_spec, _, items, plan = plan_sweep(store, "team-a", "sweepaaaaaaaaaaa")
        (cells,) = cut(items, 1)
        mine = {"kind": "judge", "tenant": "team-a", "sweep_id": "sweepaaaaaaaaaaa",
                "share_digest": share_name(cells, share_requests(items, cells)), "cells": list(cells),
                "endpoint": "stand-in", "share": 0, "shares": 1, "concurrency": 1,
                "deadline": time.time() + 60}  # fmt: skip
        assert JudgeJob.refusal(mine, "team-a") is None
        _, _, _, plan_b = plan_sweep(store, "team-b", "sweepbbbbbbbbbbb")
        theirs = mine | {
            "tenant": "team-b",
            "sweep_id": "sweepbbbbbbbbbbb",
            "share_digest": share_name(cells, plan_b.requests),
        }
        call = lambda doc: [keys.REPORT_FUNCTION, None, [doc], {}]
        planted = forged(mine, theirs, list(cells), srv.url)
        for job_id, (tenant, doc, _) in planted.items():
            plant(conn, tenant, job_id, call(doc), KEY)
        for tenant in ("team-a", "team-b"):
            worker = report_worker([tenant], connection=conn, store=store, key=KEY, max_job_bytes=2**20, beat_s=0.2)
            worker.work(burst=True)
        assert srv.hits == 0  # nothing was sent
    for job_id, (tenant, doc, reason) in planted.items():
        job = rqadapter.fetch(conn, rqadapter.tenant_job_class(tenant), job_id)
        # refused before it runs: the reason in RQ's meta; refused against the stored sweep: its failure mark
        why = job.meta.get("reason") or ReportCache(store, tenant, doc["sweep_id"]).failure(
            f"judgeshare-{doc['share_digest']}"
        )
        assert job.get_status() == "failed" and reason in why and "\n" not in why, (job_id, why)
    assert judge_spec.endpoint == "stand-in"


def test_a_share_reads_only_its_cells_and_their_baselines_generations(tmp_path):
    """A share is the requests of whole cells: the worker that runs it reads the generations of its cells and of
    their baseline, not the sweep's (before: every share read every cell's). The signer still reads them all:
    the budget is the whole report's."""
    from collections import Counter

    from controller.judge.jobs import JudgeJob
    from controller.report.distribute.signer import plan_judges

    store = open_store(str(tmp_path / "s"))
    cells = [*CELLS, ("austen-tiny", "top_p", {"p": 0.5})]  # greedy, the baseline, and 3 variants
    data = make_sweep(n_prompts=N_PROMPTS, shard_size=3, cells=cells, tenant="team-a")  # 2 jobs a cell
    data.spec["judge"] = {"endpoint": "stand-in", "model": "stand-in", "baseline": "greedy",
                          "limits": {"concurrency": 3}}  # fmt: skip
    write_with_hashes(store, data)
    cell_of = {paths.generations_key("team-a", data.sweep_id, r.job.job_id): r.job.cell for r in data.results}
    read: list[str] = []
    real = store.read_bytes
    store.read_bytes = lambda key, *a, **kw: (key in cell_of and read.append(cell_of[key])) or real(key, *a, **kw)

    total, jobs = plan_judges(store, "team-a", data.sweep_id)
    assert total == len(jobs) == 3 and len(read) == 8  # the signer: every generations file, once
    for job in jobs:
        read.clear()
        rebuilt = JudgeJob.from_payload(job.payload(), store)
        assert len(read) == 4  # its cell's 2 files and its baseline's 2 (before: all 8)
        assert Counter(read) == {job.cells[0]: 2, "austen-tiny::greedy": 2} and len(job.cells) == 1
        assert rebuilt.requests == job.requests and len(job.requests) == N_PROMPTS * 2  # both orders


def test_shares_are_contiguous_groups_of_whole_cells_with_about_as_many_requests_each():
    from controller.judge.jobs import cut
    from controller.judge.run import Item, Request

    def items(sizes: dict[str, int]) -> list[Item]:
        return [Item(cell, "base", "overall", f"p{i}", 0, (Request(f"{cell}{i}", {}),))
                for cell, n in sizes.items() for i in range(n)]  # fmt: skip

    assert cut(items({"a": 2, "b": 10, "c": 2, "d": 2}), 2) == [("a", "b"), ("c", "d")]
    assert cut(items({"a": 10, "b": 1, "c": 1}), 2) == [("a",), ("b", "c")]
    assert cut(items({"a": 1, "b": 1, "c": 10}), 3) == [("a",), ("b",), ("c",)]  # never an empty share
    assert cut(items({"a": 3, "b": 3}), 8) == [("a",), ("b",)]  # at most one share a cell
    assert cut(items({"a": 3, "b": 3}), 1) == [("a", "b")] and cut([], 4) == []


def test_a_request_two_shares_hold_counts_in_each_for_the_budget(tmp_path):
    """Two variants that wrote the same texts ask the same requests; in two shares (each rebuilt from its own
    cells) each may send them, so the budget, checked before anything is asked for, counts them twice."""
    from controller.judge.jobs import JudgeJob
    from controller.report.distribute.signer import plan_judges
    from worker.core.errors import UsageError

    store = open_store(str(tmp_path / "s"))
    data = make_sweep(n_prompts=N_PROMPTS, cells=CELLS, tenant="team-a")
    texts = {g.prompt_id: g.text for g in data.generations if g.cell == "austen-tiny::top_p(p=0.9)"}
    data.generations = [g.model_copy(update={"text": texts[g.prompt_id]}) if g.cell == "austen-tiny::top_k(k=5)"
                        else g for g in data.generations]  # fmt: skip
    data.spec["judge"] = {"endpoint": "stand-in", "model": "stand-in", "baseline": "greedy",
                          "limits": {"concurrency": 2, "max_requests": 12}}  # fmt: skip
    write_with_hashes(store, data)
    with pytest.raises(UsageError, match=r"over judge.limits.max_requests 12; raise it to 24"):
        plan_judges(store, "team-a", data.sweep_id)
    data.spec["judge"]["limits"]["max_requests"] = 24
    write_with_hashes(store, data)
    total, (one, two) = plan_judges(store, "team-a", data.sweep_id)
    assert total == 2 and one.requests == two.requests and len(one.requests) == N_PROMPTS * 2  # the same 12
    assert one.cells != two.cells and one.name != two.name  # two jobs, each rebuilt from its own cell
    assert [JudgeJob.from_payload(job.payload(), store).requests for job in (one, two)] == [one.requests] * 2


def test_the_signer_holds_the_endpoint_to_the_tenant_and_the_whole_report_to_the_budget(redis_url, tmp_path):
    import redis

    from controller.server import service
    from controller.server.tokens import Identity
    from worker.core.errors import UsageError
    from worker.core.tenants import load_tenants

    conn = redis.Redis.from_url(redis_url)
    store = open_store(str(tmp_path / "s"))
    limits = {"max_requests": 5}
    for tenant, sweep_id in (("team-a", "sweepaaaaaaaaaaa"), ("team-b", "sweepbbbbbbbbbbb")):
        data = make_sweep(n_prompts=N_PROMPTS, cells=CELLS[:2], tenant=tenant, sweep_id=sweep_id)
        data.spec["judge"] = {"endpoint": "stand-in", "model": "stand-in", "baseline": "greedy", "limits": limits}
        write_with_hashes(store, data)
    tenants = load_tenants(tenants_file(tmp_path, "http://127.0.0.1:9/v1"))
    ctx = service.Context(conn=conn, store=store, signing_key=KEY, tenants=tenants, limits=None)
    ask = lambda tenant, sweep: service.report_judges(ctx, Identity("t", tenant, False), sweep,
                                                      service.ReportJudgesRequest())  # fmt: skip
    with pytest.raises(UsageError, match="tenant 'team-b' may not use judge endpoint 'stand-in'"):
        ask("team-b", "sweepbbbbbbbbbbb")
    # the whole report's requests, before any share is asked for: 6 prompts x both orders = 12 over 5
    with pytest.raises(UsageError, match=r"over judge.limits.max_requests 5; raise it to 12"):
        ask("team-a", "sweepaaaaaaaaaaa")
    assert judge_jobs(conn, "team-a") == judge_jobs(conn, "team-b") == 0


def test_a_share_still_caching_its_replies_is_waited_for_not_taken_over(tmp_path):
    """A worker's share caches each reply as it comes: the controller's wait sees the cache grow and does not
    take the share over (and send it again, or fail it here) while it is sending, however long it takes."""
    import threading

    cache = ReportCache(open_store(str(tmp_path / "s")), "team-a", "sweepaaaaaaaaaaa")
    share = "judgeshare-" + "a" * 32

    def sending() -> None:  # 15 replies 0.1 s apart, 1.5 s in all, then the share's entry
        for i in range(15):
            time.sleep(0.1)
            cache.write(f"judge-{i:032x}", {"text": "[[A]]", "tokens": 1})
        cache.write(share, {"requests": []})

    worker = threading.Thread(target=sending)
    worker.start()
    came = list(cache.arrivals([share], stall_s=1.0, poll_s=0.05, what="judges"))
    worker.join()
    assert came == [1]
