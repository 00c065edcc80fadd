"""A share of a report's judge requests as a report task (`JudgeJob`, controller.report.compute.tasks).

The report's cells, in plan order (controller.judge.run), are cut into `shares` contiguous groups of whole
cells (`cut`); a share is the requests of its cells' items (each against its baseline), so the worker that
runs it reads only its cells' generations and their baselines'. One task sends one share's requests missing
from the report cache and caches each reply as `judge-<request digest>` (the one per-request cache: a second
report finds every reply there and makes no task at all). A share's own entry, `judgeshare-<digest>` (the
digest: its cells' names and its requests' digests), lists them; the task's output is their replies, read back
from the per-request entries.

Where it runs is the runner's (controller.report.compute.runner): in the controller (one share, at most
`limits.concurrency` requests in flight), or, for a declared endpoint and `report --distributed`, on the
report workers: `shares` = min(concurrency, cells judged), each sending one after another at
concurrency // shares, so that however many workers take them, at most `limits.concurrency` requests are
in flight for the report. A payload names the endpoint, never a URL or a key: the process that runs the
share resolves the name in its own tenants file (DECODEBENCH_TENANTS_FILE, the operator's, with the key's
mounted Secret), and a report worker refuses a payload whose tenant may not use that endpoint. The
budget: the whole report's requests and tokens are checked before any share is asked for (the
controller, and the signer again), and every share sends nothing after the report's deadline (its
start plus `limits.time_budget_s`, carried in the payload and bounded by the stored spec's budget).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import structlog

from controller.judge.client import Reply, each_reply
from controller.judge.run import (
    CACHE_VERSION,
    Item,
    Plan,
    Request,
    answers_of,
    bases_of,
    cache_entry,
    check_budget,
    endpoint_of,
    items_of,
    judge_name,
    plan_requests,
    plan_sweep,
    verdicts,
)
from controller.judge.templates import load_template
from controller.report.compute.cache import ReportCache
from controller.report.compute.runner import Runner
from controller.report.compute.tasks import DIGEST, Uncacheable
from worker.core import paths
from worker.core.errors import PermanentJobError, UsageError

FIELDS = {
    "kind",
    "tenant",
    "sweep_id",
    "share_digest",
    "cells",
    "endpoint",
    "share",
    "shares",
    "concurrency",
    "deadline",
}
MAX_SHARES = 256  # judge.limits.concurrency's bound (controller.sweep.judgespec)
SKEW_S = 60.0  # how far the signer's clock may run ahead of a report worker's (a payload's deadline)


def tenants_here():
    """This process's tenants file (DECODEBENCH_TENANTS_FILE), or None: where declared endpoints resolve."""
    from worker.core import settings
    from worker.core.tenants import load_tenants

    path = settings.get("tenants_file")
    return load_tenants(path) if path else None


def not_declared(endpoint: str) -> str:
    return f"judge endpoint {endpoint!r} is not declared here (DECODEBENCH_TENANTS_FILE)"


def for_workers(judge) -> bool:
    """Whether the report workers may send a judge's requests: a declared endpoint's only (a URL, a local model or
    a user template, a file here, are judged where the report is written)."""
    return judge.endpoint is not None and judge.template is None


def share_name(cells: tuple[str, ...], requests: tuple[Request, ...]) -> str:
    """A share's digest: its cells and its requests' digests (two shares of the same requests, cells that wrote
    the same texts, are two jobs)."""
    doc = [CACHE_VERSION, list(cells), [r.digest for r in requests]]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


def cut(items: list[Item], shares: int) -> list[tuple[str, ...]]:
    """The items' cells, in plan order, in at most `shares` contiguous groups of whole cells with about as many
    requests each (none empty): a share is the requests of its cells."""
    per: dict[str, set[str]] = {}
    for it in items:
        per.setdefault(it.cell, set()).update(r.digest for r in it.requests)
    cells, total = list(per), sum(len(d) for d in per.values())
    n = max(1, min(shares, len(cells)))
    groups: list[tuple[str, ...]] = []
    group: list[str] = []
    done = 0
    for i, cell in enumerate(cells):
        group.append(cell)
        done += len(per[cell])
        left = n - len(groups) - 1  # groups still to start after this one
        if left > 0 and (done * n >= total * (len(groups) + 1) or len(cells) - i - 1 == left):
            groups.append(tuple(group))
            group = []
    return [*groups, tuple(group)] if group else groups


def share_requests(items: list[Item], cells: tuple[str, ...]) -> tuple[Request, ...]:
    """The unique requests of the items of `cells`, in plan order: what a share sends. A request two cells
    share (two variants that wrote the same text) is in each of their shares: each sends it where missing."""
    return tuple({r.digest: r for it in items if it.cell in cells for r in it.requests}.values())


def shares_plan(jobs: list[JudgeJob], cached: set[str]) -> Plan:
    """The shares' requests as one plan, for the budget: a request in two shares counts twice (each may send it)."""
    requests = [r for job in jobs for r in job.requests]
    return Plan(requests, [r for r in requests if r.digest not in cached], cached)


@dataclass
class JudgeJob:
    """One share of a report's judge requests: its requests, where their replies are cached, how it may send."""

    kind: ClassVar[str] = "judge"
    prefix: ClassVar[str] = "judgeshare-"
    digest_field: ClassVar[str] = "share_digest"
    signer_call: ClassVar[str] = "report_judges"

    judge: Any  # the sweep's JudgeSpec
    cells: tuple[str, ...]  # the share's cells: its requests are theirs, against their baselines
    requests: tuple[Request, ...]
    cache: ReportCache
    share: int = 0
    shares: int = 1
    concurrency: int = 1  # requests in flight while this share sends
    deadline: float = math.inf  # epoch seconds: nothing is sent after it (the report's time budget)

    @property
    def digest(self) -> str:
        return share_name(self.cells, self.requests)

    @property
    def name(self) -> str:
        return self.prefix + self.digest

    @property
    def label(self) -> str:
        return f"{self.digest} ({self.share + 1}/{self.shares}, {len(self.requests)} requests)"

    @property
    def portable(self) -> bool:
        return self.judge.local is None  # a local model judges in this process

    def run(self) -> dict[str, Reply]:
        """Every request's reply: cached, else sent (and cached where the judge answered)."""
        replies = self._cached()
        missing = [r for r in self.requests if r.digest not in replies]
        if missing:
            for i, (text, info) in self._send([r.body for r in missing]):  # each cached as it comes
                r = missing[i]
                replies[r.digest] = (text, info)
                if text is not None:
                    doc = {
                        "text": text,
                        "tokens": info,
                        "model": judge_name(self.judge),
                        "version": self.judge.model_version,
                    }
                    self.cache.write(cache_entry(r.digest), doc)
        return replies

    def _cached(self, strict: bool = False) -> dict[str, Reply]:
        listing = self.cache.listing()
        out: dict[str, Reply] = {}
        for r in self.requests:
            doc = self.cache.read(cache_entry(r.digest)) if self.cache.holds(listing, cache_entry(r.digest)) else None
            try:
                out[r.digest] = (doc["text"], doc.get("tokens", 0))  # type: ignore[index]
            except (KeyError, TypeError):
                if strict:
                    raise KeyError(r.digest) from None
        return out

    def _send(self, bodies: list[dict]) -> Iterable[tuple[int, Reply]]:
        """(index, reply) of each body, as they are had."""
        judge = self.judge
        if judge.local is not None:
            from controller.judge.local import complete_local

            return enumerate(complete_local(judge, bodies))
        tenants = tenants_here() if judge.endpoint is not None else None
        if judge.endpoint is not None and (tenants is None or tenants.judge(judge.endpoint) is None):
            # a tenant's own machine has no tenants file: the cached replies are read, the rest are failures
            worker = self.cache.failure(self.name)  # a report worker's reason, where one tried first
            why = f"report worker: {worker}" if worker else not_declared(judge.endpoint)
            return enumerate([(None, why)] * len(bodies))
        limits = judge.limits.model_copy(update={"concurrency": self.concurrency})
        return each_reply(endpoint_of(judge, tenants), bodies, limits, deadline_at=self.deadline)

    def entry(self, output: dict[str, Reply]) -> dict[str, Any]:
        failed = [info for text, info in output.values() if text is None]
        if failed:  # not a share's entry: the next report asks for the failed requests again
            raise Uncacheable(f"judge: {len(failed)} of {len(output)} requests failed ({failed[0]})")
        return {"requests": [r.digest for r in self.requests]}

    def output(self, entry: dict[str, Any]) -> dict[str, Reply]:
        if entry.get("requests") != [r.digest for r in self.requests]:
            raise ValueError("not this share's entry")
        return self._cached(strict=True)  # a reply gone from the cache: the share runs again

    def payload(self) -> dict[str, Any]:
        """A judge share's payload: ids, the endpoint's name and how it may send; no URL, no key, no text."""
        where = {"tenant": self.cache.tenant, "sweep_id": self.cache.sweep_id}
        sends = {"concurrency": self.concurrency, "deadline": self.deadline}
        share = {"share_digest": self.digest, "cells": list(self.cells), "share": self.share, "shares": self.shares}
        return {"kind": self.kind, **where, "endpoint": self.judge.endpoint, **share, **sends}

    def request(self) -> tuple[str, dict[str, Any]] | None:
        return (self.cache.sweep_id, {}) if for_workers(self.judge) else None

    @classmethod
    def answered(cls, reply: dict[str, Any]) -> set[str]:
        return {cls.prefix + n for n in reply.get("names") or []}

    @classmethod
    def refusal(cls, doc: dict[str, Any], tenant: str) -> str | None:
        """Why a judge share's payload (tenant and sweep id already checked) must not run here, or None:
        its endpoint must be declared in this worker's tenants file and listed for the tenant."""
        if set(doc) != FIELDS:
            return f"refused: the judge job's fields are not {sorted(FIELDS)}"
        if not isinstance(doc["share_digest"], str) or not DIGEST.fullmatch(doc["share_digest"]):
            return "refused: the judge job's share_digest is not a cache digest"
        cells = doc["cells"]
        if not isinstance(cells, list) or not cells or not all(isinstance(c, str) and c for c in cells):
            return "refused: the judge job's cells are not a list of cell names"
        if len(set(cells)) != len(cells):
            return "refused: the judge job names a cell twice"
        ints = [doc[k] for k in ("share", "shares", "concurrency")]
        if any(type(v) is not int for v in ints) or not 0 <= ints[0] < ints[1] <= MAX_SHARES or not ints[2] >= 1:
            return "refused: the judge job's share, shares or concurrency is out of bounds"
        if type(doc["deadline"]) not in (int, float) or not math.isfinite(doc["deadline"]):
            return "refused: the judge job's deadline is not a time"
        endpoint = doc["endpoint"]
        if not isinstance(endpoint, str):
            return "refused: the judge job names no judge endpoint"
        try:
            tenants = tenants_here()
        except UsageError as err:  # an unreadable tenants file: nothing resolves here
            return f"refused: {err}"
        if tenants is None or tenants.judge(endpoint) is None:
            return f"refused: {not_declared(endpoint[:64])}"
        policy = tenants.get(tenant)
        if policy is None or endpoint not in policy.judges:
            return f"refused: tenant {tenant!r} may not use judge endpoint {endpoint[:64]!r}"
        return None

    @classmethod
    def from_payload(cls, doc: dict[str, Any], store) -> JudgeJob:
        """The share rebuilt in a report worker from its own store (the sweep's stored judge, the generations of
        the payload's cells and of their baselines, no other), checked against the payload: the sweep's judge
        names the payload's endpoint, the cells' requests are those the payload's digest was taken over, the
        deadline is within the stored budget."""
        tenant, sweep_id = doc["tenant"], doc["sweep_id"]
        try:
            judge, _, items, _ = plan_sweep(store, tenant, sweep_id, cells=doc["cells"])
        except UsageError as err:
            raise PermanentJobError(f"refused: {err}") from None
        if judge is None or judge.endpoint != doc["endpoint"]:
            raise PermanentJobError("refused: the judge job's endpoint is not the sweep's judge endpoint")
        if doc["concurrency"] > judge.limits.concurrency or doc["shares"] > judge.limits.concurrency:
            raise PermanentJobError("refused: the judge job asks for more than the sweep's judge.limits.concurrency")
        if doc["deadline"] > time.time() + judge.limits.time_budget_s + SKEW_S:
            raise PermanentJobError("refused: the judge job's deadline is past the sweep's judge.limits.time_budget_s")
        cells = tuple(doc["cells"])
        requests = share_requests(items, cells)
        if not requests or share_name(cells, requests) != doc["share_digest"]:
            raise PermanentJobError("the sweep's judge requests changed since the report was asked for; report again")
        cache = ReportCache(store, tenant, sweep_id)
        share = (doc["share"], doc["shares"], doc["concurrency"], doc["deadline"])
        return cls(judge, cells, requests, cache, *share)


def judge_jobs(judge, items: list[Item], cache: ReportCache, *, shares: int, deadline: float) -> list[JudgeJob]:
    """The report's judge tasks: the items' cells in `shares` shares (`cut`), each sending at concurrency // shares
    (one share: the whole concurrency; shares run one after another here, side by side on the workers)."""
    cuts = cut(items, shares)
    each = max(1, judge.limits.concurrency // max(1, len(cuts)))
    return [
        JudgeJob(judge, cells, share_requests(items, cells), cache, i, len(cuts), each, deadline)
        for i, cells in enumerate(cuts)
    ]


def remote_shares(judge, items: list[Item]) -> int:
    """How many shares a report asks the report workers for: at most one per request in flight, and per cell."""
    return max(1, min(judge.limits.concurrency, len({it.cell for it in items})))


def judge_sweep(store, tenant: str, sweep_id: str, judge, results, cell_order: list[str], *, runner=None,
                dry_run: bool = False) -> tuple[Plan, list[dict[str, Any]]]:  # fmt: skip
    """The sweep's verdicts (see the module doc); with `dry_run`, the plan only (nothing sent or written).
    `runner` (controller.report.compute.runner) runs the shares (controller.judge.jobs): here by default; with
    its report workers, a declared endpoint's shares on them."""
    template = load_template(judge.mode, judge.template)
    bases = bases_of(judge, results, cell_order)
    items = items_of(judge, template, answers_of(store, tenant, sweep_id, results), bases)
    plan = plan_requests(store, tenant, sweep_id, items)
    if dry_run:
        return plan, []
    runner = runner or Runner()
    remote = runner.remote is not None and for_workers(judge)
    here = judge.endpoint is None or (tenants := tenants_here()) is not None and tenants.judge(judge.endpoint)
    shares = remote_shares(judge, items) if remote else 1
    cache = ReportCache(store, tenant, sweep_id)
    jobs = judge_jobs(judge, items, cache, shares=shares, deadline=time.time() + judge.limits.time_budget_s)
    if plan.missing and (remote or here):  # nothing is sent where the endpoint is neither here nor remote
        check_budget(shares_plan(jobs, plan.cached), judge.limits)
    replies: dict[str, Reply] = {}
    for _, out in runner.run(jobs, cache, "judges"):
        replies.update(out)
    records = verdicts(judge, template, items, replies)
    store.write_jsonl(paths.report_key(tenant, sweep_id, paths.JUDGE_VERDICTS_FILE), records)
    failed = [r["failure"] for r in records if "failure" in r]
    if failed:  # counted in the judge's table; the reason said once here, each in the verdicts file
        structlog.get_logger("decodebench.report").warning(
            f"judge: {len(failed)} of {len(records)} verdicts failed ({failed[0]}); report/"
            f"{paths.JUDGE_VERDICTS_FILE} names each, and the next report asks for them again"
        )
    return plan, records
