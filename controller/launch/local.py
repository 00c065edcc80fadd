"""Local mode: plan a sweep and run its jobs in-process, no Redis.

The executor calls the same `worker.engine.job.run_job` as the RQ task. Jobs that already
have a complete result are skipped, so an interrupted run resumes where it stopped.

A model that cannot be had fails once: every model is resolved before any job runs
(`controller.launch.models`), and a model that still fails to load marks itself unavailable
(`ModelUnavailableError`): that job failed, and the other jobs that need it are skipped with that one reason.
Ctrl-C stops after the running job's interruption and returns what was done.

A sweep resumed after a local model's files changed at the same path, or after a plugin strategy's distribution
changed version, is refused before any job runs (`check_model_files`, `check_plugins`): its cells would mix two
models' (or two plugin versions') generations under one name.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import structlog

from controller.launch.models import check_models, models_of
from controller.sweep.context import check_context
from controller.sweep.labels import key_labels
from controller.sweep.load import load_spec
from controller.sweep.models import SweepSpec
from controller.sweep.plan import plan, summarize_plan
from worker.core import paths
from worker.core.contract import JobSpec
from worker.core.engines import VLLM_ENGINE, VLLM_INSTALL, engine_refusal
from worker.core.errors import CorruptRecordError, DecodebenchError, ModelUnavailableError, UsageError, short, shown
from worker.core.results import model_hashes, plugin_of
from worker.core.safetext import terminal
from worker.store import Store
from worker.strategies import get_strategy

log = structlog.get_logger("decodebench.local")


@dataclass
class RunOutcome:
    sweep_id: str
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    # a model that cannot be had: its path -> the one reason; and the jobs skipped for it (not the job whose load
    # failed: that one is in `failed`, with the same reason)
    unavailable: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)  # job id -> model path
    interrupted: bool = False  # Ctrl-C: the jobs not run are left for the next run

    @property
    def n_failed(self) -> int:
        return len(self.failed)

    @property
    def n_skipped(self) -> int:
        """Jobs not run because their model cannot be had (the jobs already complete are `skipped`)."""
        return len(self.blocked)

    def state(self, job_id: str) -> str:
        """How a job of this run finished: done, skipped (its model unavailable) or failed."""
        return "skipped" if job_id in self.blocked else "failed" if job_id in self.failed else "done"


def save_sweep(store: Store, spec: SweepSpec, jobs: list[JobSpec], tenant: str, mode: str) -> None:
    """spec.json (the validated spec) and plan.json (job ids per cell); written once per sweep, but for the
    judge's limits: not part of the sweep id, the last run's or submission's are kept (`report SWEEP` reads them)."""
    sweep_id = jobs[0].sweep_id
    written = store.write_json(
        paths.spec_key(tenant, sweep_id),
        {
            "sweep_id": sweep_id,
            "tenant": tenant,
            "name": spec.name,
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
            "mode": mode,
            "spec": spec.model_dump(mode="json"),
            "base_dir": str(spec.base_dir) if spec.base_dir else None,
        },
        create_only=True,
    )
    if not written and spec.judge is not None:
        _keep_judge_limits(store, paths.spec_key(tenant, sweep_id), spec.judge.limits.model_dump(mode="json"))
    store.write_json(
        paths.plan_key(tenant, sweep_id),
        {
            "sweep_id": sweep_id,
            "jobs": [
                {"job_id": j.job_id, "cell": j.cell, "seed": j.seed, "shard": j.shard, "prompts": len(j.prompts)}
                for j in jobs
            ],
        },
        create_only=True,
    )


def _keep_judge_limits(store: Store, key: str, limits: dict) -> None:
    """The stored spec's judge limits replaced by `limits` where they differ (a raised budget, run or submitted
    again); the rest of spec.json as it was written first, whether it wraps the spec or is an older one, the spec
    alone (`inner_spec`, as the report reads it)."""
    from controller.sweep.load import inner_spec

    stored = store.read_json(key)
    judge = inner_spec(stored).get("judge") if isinstance(stored, dict) else None
    if isinstance(judge, dict) and judge.get("limits") != limits:
        judge["limits"] = limits
        store.write_json(key, stored)


def run_sweep(
    spec: SweepSpec | str | Path,
    store: Store,
    tenant: str = "default",
    device: str = "cpu",
    progress: bool | None = True,
    *,
    check: bool = True,
    runtime=None,
) -> RunOutcome:
    """Run every job of the sweep that is not yet complete; return what happened.

    `progress`: True a live bar, None a line per tenth of the jobs on stderr, False nothing.
    `check`: resolve every model before the first job (see the module doc).
    `runtime`: a `worker.engine.job.Runtime` to run on, with the models it holds (the vLLM tests share
    one); by default a new one on `device`."""
    from worker.engine.job import EngineSettings, Runtime, run_job  # the one place the controller hosts the engine

    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    if runtime is None:
        runtime = Runtime(device, EngineSettings.from_environment())  # a device that does not exist fails first
    jobs = plan(spec, tenant)
    check_engines(jobs)
    check_context(jobs)
    outcome = RunOutcome(jobs[0].sweep_id)
    save_sweep(store, spec, jobs, tenant, mode="local")
    complete = store.complete_job_ids(tenant, outcome.sweep_id)
    recorded = recorded_provenance(store, tenant)  # each complete job's result read once, for both checks
    check_model_files(jobs, complete, recorded)
    check_plugins(jobs, complete, recorded)
    todo = [j for j in jobs if j.job_id not in complete]
    outcome.skipped = [j.job_id for j in jobs if j.job_id in complete]
    summary = summarize_plan(jobs)
    log.info("sweep.start", sweep_id=outcome.sweep_id, jobs=summary.jobs, todo=len(todo), cells=summary.cells)
    if check and todo:
        for c in check_models(todo):
            if c.reason:
                outcome.unavailable[c.model.path] = c.line
    cells = list(dict.fromkeys(j.cell for j in jobs))
    label = dict(zip(cells, key_labels(cells)))  # as the report names the cells
    with _progress(progress, len(todo)) as advance:
        try:
            for job in todo:
                _run_one(job, store, runtime, outcome, run_job)
                advance(label[job.cell], outcome.state(job.job_id))
        except KeyboardInterrupt:
            outcome.interrupted = True
    return outcome


def check_engines(jobs: list[JobSpec]) -> None:
    """A UsageError naming the first strategy x engine pair that cannot run exactly, or an engine not installed
    in this environment (with how to install it); before anything is written."""
    for job in jobs:
        why = engine_refusal(job.engine, job.strategy.name, job.strategy.params, job.generation, job.strategy.best_of)
        if why:
            raise UsageError(why)
    if any(j.engine is not None and j.engine.name == VLLM_ENGINE for j in jobs) and not importlib.util.find_spec(
        "vllm"
    ):
        raise UsageError(f"engine vllm: vLLM is not installed in this environment; install it with {VLLM_INSTALL}")


def check_model_files(jobs: list[JobSpec], complete: set[str], recorded: Callable[[JobSpec], dict]) -> None:
    """A UsageError, before any job runs, where a local model that jobs still to run load (their own, the scorer,
    the featurizer, an assisted strategy's draft) has files other than those the sweep's complete jobs loading it
    recorded (their result.json's `content_hash`): resumed, its cells would mix two models under one name. The
    hash is the engine's own, which keeps it for the load that follows."""
    from worker.engine.checkpoint import content_hash  # the hash each result records (no torch)

    pending = {m.path: m for j in jobs if j.job_id not in complete for m in models_of(j) if Path(m.path).is_dir()}
    for path, model in pending.items():
        done = (j for j in jobs if j.job_id in complete and any(m.path == path for m in models_of(j)))
        hashes = (model_hashes(recorded(j)) for j in done)
        then = next((h[path][1] for h in hashes if path in h), None)
        if then is None:  # none of its jobs complete yet (or none recorded a hash): nothing to mix with
            continue
        now = content_hash(Path(path))
        if now != then:
            raise UsageError(
                f"model {short(model.label)} ({shown(path)}): its files changed since this sweep's complete jobs of "
                f"it ran (content hash {then[:12]}, now {now[:12]}); restore them, or run it as a new sweep "
                "(change the sweep's name or the model's path)"
            )


def check_plugins(jobs: list[JobSpec], complete: set[str], recorded: Callable[[JobSpec], dict]) -> None:
    """A UsageError, before any job runs, where a plugin strategy that jobs still to run use comes from another
    distribution or version than the one the sweep's complete jobs of it recorded (`provenance.strategy_plugin`):
    resumed, its cells would mix two versions of the strategy under one name. The sweep id leaves the plugin's
    version out, as it does decodebench's own (docs/sweeps.md, "Write your own strategy")."""
    pending = {j.strategy.name for j in jobs if j.job_id not in complete}
    for name in sorted(pending):
        done = (j for j in jobs if j.job_id in complete and j.strategy.name == name)
        then = next((p for p in (plugin_of(recorded(j)) for j in done) if p), None)
        now = get_strategy(name).plugin
        if then is not None and then != now:
            raise UsageError(
                f"strategy {short(name)}: this sweep's complete jobs of it ran plugin {shown(then)}, now "
                f"{shown(now) if now else 'the built-in strategy'}; install that version again, or run it as a new "
                "sweep (change the sweep's name)"
            )


def recorded_provenance(store: Store, tenant: str) -> Callable[[JobSpec], dict]:
    """`recorded(job)`: the provenance a complete job's result.json records (empty for a damaged result, which the
    report names), each read once."""

    @cache
    def read(sweep_id: str, job_id: str) -> dict:
        try:
            return store.load_result(tenant, sweep_id, job_id).provenance
        except CorruptRecordError:
            return {}

    return lambda job: read(job.sweep_id, job.job_id)


def _run_one(job: JobSpec, store: Store, runtime, outcome: RunOutcome, run_job) -> None:
    down = next((m.path for m in models_of(job) if m.path in outcome.unavailable), None)
    if down is not None:  # its model failed once already: skipped, with that reason
        outcome.blocked[job.job_id] = down
        return
    try:
        run_job(job, store=store, runtime=runtime)
        outcome.ran.append(job.job_id)
    except UsageError:
        raise
    except ModelUnavailableError as err:  # this job failed; the model's other jobs are skipped with its reason
        outcome.unavailable[err.model or job.model.path] = str(err)
        outcome.failed[job.job_id] = str(err)
    except DecodebenchError as err:
        outcome.failed[job.job_id] = str(err)
    except Exception as err:  # a job's crash must not lose the other jobs
        outcome.failed[job.job_id] = f"{type(err).__name__}: {err}".splitlines()[0]


class _progress:
    """A rich progress bar, a line per tenth of the jobs (`enabled` None: no TTY), or nothing,
    with an `advance(label)` callback."""

    def __init__(self, enabled: bool | None, total: int) -> None:
        self.enabled, self.total = enabled, total
        self.stack = contextlib.ExitStack()

    def __enter__(self):
        if self.enabled is None:
            return _lines(self.total)
        if not self.enabled:
            return lambda label, state="done": None
        from rich.markup import escape
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        bar = self.stack.enter_context(stderr_bar(*columns, TimeRemainingColumn()))
        task = bar.add_task("jobs", total=self.total)
        counts = _Counts()

        def advance(label: str, state: str = "done") -> None:
            # the cell's label is user text: its escapes shown, not run, and no rich markup in it
            note = counts.add(state)
            bar.update(task, advance=1, description=escape(terminal(label)[:40]) + (f" ({note})" if note else ""))

        return advance

    def __exit__(self, *exc) -> None:
        self.stack.close()


@contextlib.contextmanager
def stderr_bar(*columns) -> Iterator:
    """A rich Progress of these columns on stderr (stdout keeps the table alone), for `run`'s jobs and
    `report`'s phases (controller.cli.progress); while it runs, the stdlib log handlers that wrote to
    stderr print above it."""
    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(*columns, console=Console(stderr=True), transient=False)
    bar.start()
    handlers = repoint_log_handlers(sys.stderr)
    try:
        yield bar
    finally:
        bar.stop()
        for handler, stream in handlers:
            handler.setStream(stream)


def repoint_log_handlers(stream) -> list:
    """Stdlib StreamHandlers writing to the real stderr (transformers' and others', set up before
    the bar) write to `stream` instead; returns (handler, old stream) to put back."""
    import logging

    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    out = []
    for logger in loggers:
        for h in logger.handlers:
            if type(h) is logging.StreamHandler and h.stream is sys.__stderr__:
                out.append((h, h.setStream(stream)))
    return out


def tenth_lines(form: str) -> Callable[[str, int, int], None]:
    """Progress without a TTY: `tick(what, done, total)` prints `form` (with {what}, {done}, {total} and
    {elapsed}) on stderr when a phase passes another tenth of its total, and at its end (once): `run`'s
    jobs and `report`'s phases (controller.cli.progress)."""
    start, printed = time.monotonic(), {}

    def tick(what: str, done: int, total: int, **extra: str) -> None:
        if total <= 0:
            return
        tenth = 10 if done >= total else done * 10 // total
        if tenth <= printed.get(what, 0):
            return  # within the tenth last printed
        printed[what] = tenth
        m, s = divmod(int(time.monotonic() - start), 60)
        line = form.format(what=what, done=done, total=total, elapsed=f"{m}m{s:02d}s", **extra)
        print(line, file=sys.stderr, flush=True)

    return tick


def _lines(total: int):
    """Without a TTY: `jobs 6/60 done (0m41s)` on stderr every tenth of the jobs, and at the end."""
    tick, done, counts = tenth_lines("jobs {done}/{total} {note} ({elapsed})"), [0], _Counts()

    def advance(label: str, state: str = "done") -> None:
        done[0] += 1
        tick("jobs", done[0], total, note=counts.add(state) or "done")

    return advance


class _Counts:
    """The jobs finished so far by how: `add(state)` returns `` while every one ran, else
    `finished: 3 done, 9 skipped, 0 failed`, so that a skipped job is never counted as done."""

    def __init__(self) -> None:
        self.by = {"done": 0, "skipped": 0, "failed": 0}

    def add(self, state: str) -> str:
        self.by[state] = self.by.get(state, 0) + 1
        if self.by["skipped"] == self.by["failed"] == 0:
            return ""
        return "finished: " + ", ".join(f"{n} {k}" for k, n in self.by.items())
