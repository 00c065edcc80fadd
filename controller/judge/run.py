"""A sweep's judge requests: built from its generations, cached by content, budgeted, read back as verdicts.

The report's judge (`judge_sweep`, controller.judge.jobs) builds here every request the sweep's `judge:` asks for
(pairwise: each variant's answer, every sample of it, against its baseline's answer to the same prompt, seed and
sample, per criterion, in both orders; single: each answer, per criterion), keys each by the sha256 of its content
(the chat messages, which hold the prompt, both texts and their order, and the criterion; the template's hash; the
judge model and version, and a local judge's model files; the sampling settings), and looks each key up in the
report cache (`report/cache/judge-<digest>.json`, worker.core.paths, beside the cells' and pairs' outputs). Only
the missing ones are sent, after the budget is checked: a report over `limits.max_requests` or
`limits.max_tokens` stops before sending anything, naming what it would need. A reply is cached as
the judge wrote it, parsable or not (an unparsed verdict is an outcome); a failed request is not
cached, so a later report asks again. The verdicts are written to `report/judge-verdicts.jsonl`,
each with the template's hash. The missing requests are sent by report tasks, shares of whole cells
(controller.judge.jobs), through the report's runner: here, or on the report workers.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.judge.client import Endpoint, Reply, read_key
from controller.judge.templates import Template, load_template
from controller.judge.verdicts import Verdict, combine_orders, parse_grade, parse_pairwise
from controller.report.compute.cache import ReportCache
from worker.core.errors import UsageError

CACHE_VERSION = "1"
# a local judge's replies depend on how its requests are rendered too: 2 since a chat model gets the turns through its
# template (controller.judge.local), so replies cached when it got them flattened are asked again (an endpoint's keep)
LOCAL_RENDERING = 2
CHARS_PER_TOKEN = 4  # the budget's estimate of a request's tokens before it is sent


@dataclass(frozen=True)
class Request:
    digest: str
    body: dict = field(repr=False)

    @property
    def est_tokens(self) -> int:
        chars = sum(len(m["content"]) for m in self.body["messages"])
        return chars // CHARS_PER_TOKEN + self.body["max_tokens"]


@dataclass
class Plan:
    """What a report's judge needs: every request, those not in the cache, and the estimated tokens of those."""

    requests: list[Request]
    missing: list[Request]
    cached: set[str]

    @property
    def missing_tokens(self) -> int:
        return sum(r.est_tokens for r in self.missing)

    def line(self) -> str:
        return (
            f"judge: {len(self.requests):,} requests, {len(self.requests) - len(self.missing):,} cached, "
            f"{len(self.missing):,} to send (~{self.missing_tokens:,} tokens)"
        )


def judge_name(judge) -> str:
    return judge.model or f"local:{judge.local.path}@{judge.local.revision or ''}"


def judge_fingerprint(judge) -> str | None:
    """A local judge's model files' hash (worker.engine.checkpoint.content_hash, the one the engine records in a
    result's provenance: weights, config, tokenizer and its chat template), so that a judge retrained at the same
    path, or given another template, is asked again; None for an endpoint's, or a hub model's (its `revision`)."""
    if judge.local is None or not Path(judge.local.path).is_dir():
        return None
    from worker.engine.checkpoint import content_hash  # hashlib only: no torch here

    return content_hash(Path(judge.local.path), templates=True)


def make_request(
    judge, template: Template, criterion: str, prompt: str, answers: tuple[str, ...], model_hash: str | None = None
) -> Request:
    """One request and its digest; `model_hash`: a local judge's `judge_fingerprint`, part of the digest."""
    body: dict[str, Any] = {
        "model": judge_name(judge),
        "messages": template.messages(criterion, prompt, answers),
        "temperature": judge.temperature,
        "max_tokens": judge.max_new_tokens,
    }
    if judge.seed is not None:
        body["seed"] = judge.seed
    doc = [CACHE_VERSION, template.sha256, judge_name(judge), judge.model_version, body]
    doc += [LOCAL_RENDERING] if judge.local is not None else []
    doc += [model_hash] if model_hash is not None else []  # a hub judge's keys stay as they were (its revision)
    return Request(hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32], body)


def cache_entry(digest: str) -> str:
    """A judge's reply's name in the report cache (controller.report.compute.cache)."""
    return f"judge-{digest}"


@dataclass
class Item:
    """One judged unit: pairwise (cell vs baseline, answers in both orders) or single (one answer)."""

    cell: str
    baseline: str | None
    criterion: str
    prompt_id: str
    job_seed: int
    requests: tuple[Request, ...]
    len_diff: int = 0  # characters: the variant's answer minus the baseline's
    sample: int = 0  # which of the prompt's samples in its job (GenerationRecord.sample)
    against: tuple[int, int] | None = None  # pairwise: the baseline's answer's (job_seed, sample)


Key = tuple[str, int, int]  # a cell's answer: (prompt_id, job_seed, sample)


def answers_of(store, tenant: str, sweep_id: str, results, cells=None) -> dict[str, dict[Key, Any]]:
    """cell -> (prompt_id, job_seed, sample) -> its generation, every sample of a variant with `samples`, from the
    complete jobs' generations (with `cells`: only those cells' jobs' generations are read)."""
    out: dict[str, dict[Key, Any]] = defaultdict(dict)
    for r in results:
        if cells is not None and r.job.cell not in cells:
            continue
        for g in store.load_generations(tenant, sweep_id, r.job.job_id, r.generations_sha256):
            out[g.cell].setdefault((g.prompt_id, g.job_seed, g.sample), g)
    return out


def counterparts(base: dict[Key, Any]) -> Callable[[str, int, int], Any]:
    """(prompt_id, job_seed, sample) -> the baseline's answer a variant's answer there is judged against: the
    baseline's same sample of that prompt and seed, else its first sample of that prompt and seed, else (a
    deterministic baseline, one seed) its first answer to that prompt; None where it has none."""
    first: dict[Any, Any] = {}
    for (pid, seed, _), g in sorted(base.items()):
        first.setdefault((pid, seed), g)
        first.setdefault(pid, g)
    return lambda pid, seed, sample: base.get((pid, seed, sample)) or first.get((pid, seed)) or first.get(pid)


def bases_of(judge, results, cell_order: list[str]) -> dict[str, str | None]:
    """cell -> the baseline cell its answers are judged against (None: judged alone, or nothing to compare with),
    the cells in plan order; from the results only (a generation's model and strategy are its job's), so that a
    share of the cells is planned without reading the other cells' generations."""
    from controller.report.stats.cellstats import CellStats
    from controller.report.stats.paired import baselines

    kinds: dict[str, tuple[str, str]] = {}
    for r in results:
        kinds.setdefault(r.job.cell, (r.job.model.label, r.job.strategy.name))
    cells = [c for c in cell_order if c in kinds] + sorted(c for c in kinds if c not in cell_order)
    if judge.mode == "single":
        return dict.fromkeys(cells)
    return baselines([CellStats(c, *kinds[c], [], {}) for c in cells], judge.baseline)


def items_of(judge, template: Template, answers: dict, bases: dict[str, str | None]) -> list[Item]:
    """Every item the judge is asked about for the cells of `bases` (`bases_of`), in plan order: every answer of
    each cell, each sample of a variant with `samples` (pairwise: against its `counterparts` in the baseline)."""
    model_hash = judge_fingerprint(judge)  # once per report: a local judge's files are read here only
    items = []
    for cell, base in bases.items():
        if cell not in answers:
            continue
        if judge.mode == "single":
            for (pid, seed, sample), g in sorted(answers[cell].items()):
                for c in judge.criteria:
                    asked = (make_request(judge, template, c, g.prompt, (g.text,), model_hash),)
                    items.append(Item(cell, None, c, pid, seed, asked, sample=sample))
            continue
        if base is None or base not in answers:
            continue
        against = counterparts(answers[base])
        for (pid, seed, sample), g in sorted(answers[cell].items()):
            b = against(pid, seed, sample)
            if b is None:
                continue
            for c in judge.criteria:
                first = make_request(judge, template, c, g.prompt, (g.text, b.text), model_hash)
                swapped = make_request(judge, template, c, g.prompt, (b.text, g.text), model_hash)
                diff = len(g.text) - len(b.text)
                items.append(Item(cell, base, c, pid, seed, (first, swapped), diff, sample, (b.job_seed, b.sample)))
    return items


def plan_requests(store, tenant: str, sweep_id: str, items: list[Item]) -> Plan:
    unique = list({r.digest: r for it in items for r in it.requests}.values())
    listing = ReportCache(store, tenant, sweep_id).listing()  # one listing
    cached = {r.digest for r in unique if ReportCache.holds(listing, cache_entry(r.digest))}
    return Plan(unique, [r for r in unique if r.digest not in cached], cached)


class OverBudget(UsageError):
    """The requests missing from the cache exceed a `judge.limits` budget: nothing is sent."""


def check_budget(plan: Plan, limits) -> None:
    """OverBudget (one line, before anything is sent) where the requests missing from the cache exceed a limit."""
    if len(plan.missing) > limits.max_requests:
        raise OverBudget(
            f"{plan.line()}: over judge.limits.max_requests {limits.max_requests:,}; raise it to {len(plan.missing):,}"
        )
    if plan.missing_tokens > limits.max_tokens:
        raise OverBudget(
            f"{plan.line()}: over judge.limits.max_tokens {limits.max_tokens:,}; raise it to {plan.missing_tokens:,}"
        )


def endpoint_of(judge, tenants=None) -> Endpoint:
    """Where requests go: a URL (local runs) or the tenants file's declared endpoint of that name."""
    if judge.url is not None:
        return Endpoint(judge.url, read_key(judge.api_key_env, judge.api_key_file))
    declared = tenants.judge(judge.endpoint) if tenants is not None else None
    if declared is None:
        raise UsageError(
            f"judge.endpoint: {judge.endpoint!r} is not declared in the tenants file (DECODEBENCH_TENANTS_FILE)"
        )
    return Endpoint(declared.url, read_key(declared.api_key_env, declared.api_key_file))


def _verdict(reply: Reply) -> Verdict:
    return Verdict.FAILED if reply[0] is None else parse_pairwise(reply[0])


def verdicts(judge, template: Template, items: list[Item], replies: dict[str, Reply]) -> list[dict[str, Any]]:
    """One record per item: the parsed verdict(s), the outcome, and the template's hash."""
    out = []
    for it in items:
        rec: dict[str, Any] = {"cell": it.cell, "criterion": it.criterion, "prompt_id": it.prompt_id,
                               "job_seed": it.job_seed, "sample": it.sample, "template": template.name,
                               "template_sha256": template.sha256, "judge": judge_name(judge)}  # fmt: skip
        if judge.mode == "single":
            reply = replies[it.requests[0].digest]
            grade = parse_grade(reply[0]) if reply[0] is not None else None
            status = Verdict.FAILED if reply[0] is None else (Verdict.UNPARSED if grade is None else None)
            rec.update(grade=grade, outcome=status.value if status else "graded")
        else:
            first, swapped = (_verdict(replies[r.digest]) for r in it.requests)
            outcome = combine_orders(first, swapped)
            base_seed, base_sample = it.against or (None, None)  # the baseline's answer, for the raters' ratings
            rec.update(baseline=it.baseline, first=first.value, swapped=swapped.value, outcome=outcome.value,
                       len_diff=it.len_diff, baseline_job_seed=base_seed, baseline_sample=base_sample)  # fmt: skip
        failed = [replies[r.digest][1] for r in it.requests if replies[r.digest][0] is None]
        if failed:
            rec["failure"] = str(failed[0])
        out.append(rec)
    return out


def judge_of(spec: dict):
    """The sweep's JudgeSpec from its stored spec (None: the sweep has no judge)."""
    from controller.sweep.judgespec import JudgeSpec

    return JudgeSpec.model_validate(spec["judge"]) if spec.get("judge") else None


def plan_sweep(
    store, tenant: str, sweep_id: str, data=None, cells: list[str] | None = None
) -> tuple[Any, Template | None, list[Item], Plan]:
    """The sweep's judge, template, items and requests, planned from the store (its stored spec, its complete
    jobs' generations) as the report plans them: the signer plans a report's shares with it. With `cells` (a
    report worker's share, controller.judge.jobs): the items of those cells only, reading only their
    generations and their baselines' (UsageError: a cell the sweep's judge does not know)."""
    from pydantic import ValidationError

    if data is None:
        from controller.report.load.sweep import load_sweep

        data = load_sweep(store, tenant, sweep_id, with_generations=False)
    try:
        judge = judge_of(data.sweep_spec)
    except ValidationError as err:
        raise UsageError(f"the sweep's judge section is not valid ({err.error_count()} errors)") from None
    if judge is None:
        return None, None, [], Plan([], [], set())
    if judge.template is not None:
        raise UsageError(
            "judge.template: a user template is for local runs; the report workers read no file a sweep names"
        )
    template = load_template(judge.mode, None)
    bases = bases_of(judge, data.results, data.cell_order)
    reads = None
    if cells is not None:
        if not set(cells) <= set(bases):
            raise UsageError("the judge job's cells are not the sweep's cells")
        bases = {c: b for c, b in bases.items() if c in cells}
        reads = set(bases) | {b for b in bases.values() if b is not None}
    items = items_of(judge, template, answers_of(store, tenant, sweep_id, data.results, reads), bases)
    return judge, template, items, plan_requests(store, tenant, sweep_id, items)
