"""Local commands: validate, run (in-process, no Redis), strategies, metrics."""

from __future__ import annotations

import json
import sys

import click

from controller.cli import options
from controller.cli.options import location, store_flag
from controller.cli.progress import progress_mode
from controller.sweep.wording import plural
from worker.core import settings
from worker.core.errors import UsageError
from worker.core.safetext import terminal


@click.command()
@click.argument("spec_path", metavar="SPEC", required=False)
@click.option("--schema", is_flag=True, help="Print the JSON schema of sweep specs and exit.")
@options.tenant
@click.option("--jobs", "show_jobs", is_flag=True, help="List every job.")
@click.option(
    "--show-prompt",
    is_flag=True,
    help="Print the first prompt as each model is fed it: its chat template rendered, or the raw text.",
)
@click.option(
    "--check-models",
    is_flag=True,
    help="Also resolve every model (a hub id: in the local cache or on the hub) without loading weights.",
)
def validate(
    spec_path: str | None, schema: bool, tenant: str, show_jobs: bool, show_prompt: bool, check_models: bool
) -> None:
    """Check a sweep spec and print its job plan."""
    from controller.sweep.load import load_spec
    from controller.sweep.models import json_schema
    from controller.sweep.plan import plan, summarize_plan
    from worker.core.policy import Limits, job_refusal

    if schema:
        click.echo(json.dumps(json_schema(), indent=2))
        return
    if not spec_path:
        raise UsageError("validate: give a SPEC file (or --schema)")
    from controller.sweep.context import check_context

    _plugin_problems()
    spec = load_spec(spec_path)
    jobs = plan(spec, tenant)
    limits = Limits.from_settings()  # the per-job limits the submission server and workers apply
    if why := next((w for j in jobs if (w := job_refusal(j, None, limits))), None):
        raise UsageError(why)
    check_context(jobs)
    s = summarize_plan(jobs)
    click.echo(f"{terminal(spec_path)}: valid")
    click.echo(
        f"sweep {s.sweep_id}: {s.cells} {plural(s.cells, 'cell')}, {s.jobs} {plural(s.jobs, 'job')}, "
        f"{s.prompts} {plural(s.prompts, 'prompt')}, {s.generations} {plural(s.generations, 'generation')}, "
        f"up to {s.tokens_to_generate:,} {plural(s.tokens_to_generate, 'token')} to generate"
    )
    click.echo(f"limit: {settings.get('max_jobs'):,} jobs per sweep (DECODEBENCH_MAX_JOBS)")
    repeated_notes(spec)
    cells: dict[str, list] = {}
    for j in jobs:
        cells.setdefault(j.cell, []).append(j)
    for cell, cjobs in cells.items():
        seeds = sorted({j.seed for j in cjobs})
        click.echo(f"  {terminal(cell)}: {len(cjobs)} {plural(len(cjobs), 'job')}, seeds {seeds}")
        if show_jobs:
            for j in cjobs:
                click.echo(f"    {j.job_id}  seed={j.seed} shard={j.shard}/{j.n_shards} prompts={len(j.prompts)}")
    if show_prompt:
        _show_prompt(jobs)
    if check_models:
        _check_models(jobs)


def _show_prompt(jobs) -> None:
    """The sweep's first prompt as each model is fed it, one line each (newlines and control characters shown
    as escapes: a template's whitespace is part of what the model sees)."""
    from controller.sweep.chat import sent_text

    item = jobs[0].prompts[0]
    for model in {j.model.label: j.model for j in jobs}.values():
        how, text = sent_text(model, item)
        click.echo(f"prompt {terminal(item.id)} as model {terminal(model.label)} is fed it ({how}):")
        if text is not None:
            click.echo(f"  {terminal(text)}")


def _check_models(jobs) -> None:
    from controller.launch.models import check_models

    checks = check_models(jobs)
    for c in checks:
        click.echo(f"  {terminal(c.line)}")
    bad = sum(1 for c in checks if c.reason)
    if bad:
        raise UsageError(f"{bad} of {len(checks)} {plural(len(checks), 'model')} unavailable (see above)")


@click.command()
@click.argument("spec_path", metavar="SPEC")
@settings.option("store", "--store")
@click.option("--out", "old_out", default=None, hidden=True)  # the store's former name on `run`
@settings.option("device", default="cpu", help="Device: cpu or cuda:N; never falls back silently.")
@options.tenant
@click.option("--no-progress", is_flag=True, help="No progress bar (without a TTY: no progress lines).")
@click.option("--no-check-models", is_flag=True, help="Do not resolve every model before the first job.")
@click.option("-v", "--verbose", is_flag=True, help="Log each job's info lines here too (= --log-level info).")
def run(
    spec_path: str, store: str, old_out: str | None, device: str, tenant: str, no_progress: bool,
    no_check_models: bool, verbose: bool,
) -> None:  # fmt: skip
    """Run a sweep locally, in-process, then print the comparison and the report's path.

    At a terminal: the progress bar, warnings and the result; each job's info lines go to its
    log.jsonl (`decodebench logs JOB`), and here too with -v or --log-level info."""
    from controller.launch.local import run_sweep
    from controller.sweep.load import load_spec
    from worker.store import open_store

    store = old_out if old_out is not None else store
    quiet_console(verbose)
    settings.parse_device(device)
    spec = load_spec(spec_path)
    repeated_notes(spec)
    opened = open_store(store)
    bar = progress_mode(no_progress)  # None: a line per tenth of the jobs
    resume = f"run the same command again to resume: decodebench run {terminal(spec_path)}{store_flag(store)}"
    try:
        outcome = run_sweep(spec, opened, tenant=tenant, device=device, progress=bar, check=not no_check_models)
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted before the first job; {resume}", err=True)
        sys.exit(130)
    n, skipped = len(outcome.ran), outcome.n_skipped
    click.echo(
        f"sweep {outcome.sweep_id}: {n} {plural(n, 'job')} run, {len(outcome.skipped)} already complete, "
        f"{outcome.n_failed} failed" + (f", {skipped} skipped (model unavailable)" if skipped else "")
    )
    if outcome.interrupted:
        click.echo(f"interrupted (Ctrl-C); complete jobs are kept, {resume}", err=True)
        sys.exit(130)
    try:
        judged = _report(opened, tenant, outcome.sweep_id, store_flag(store), spec.judge.limits if spec.judge else None)
    except KeyboardInterrupt:
        again = f"decodebench report {outcome.sweep_id}{store_flag(store)}"
        click.echo(f"\ninterrupted while writing the report; the jobs are kept, {again} writes it", err=True)
        sys.exit(130)
    _failures(outcome)
    if judged is not None:  # the report is written without the judge's verdicts: say why, as an error
        raise UsageError(judged)
    if outcome.n_failed or outcome.n_skipped:
        sys.exit(1)


def repeated_notes(spec) -> None:
    """A note on stderr for each strategy variant the spec lists twice (`plan.repeated_variants`): one cell."""
    from controller.sweep.plan import repeated_variants

    for line in repeated_variants(spec):
        click.echo(f"note: {terminal(line)}", err=True)


def quiet_console(verbose: bool) -> None:
    """`run`'s console shows warnings and errors unless asked for more (-v, --log-level or its variable):
    the per-job info lines are in each job's log.jsonl, and four per job would bury the bar and the result."""
    from worker.core.logs import configure

    root = click.get_current_context().find_root()
    chosen = root.get_parameter_source("log_level") not in (None, click.core.ParameterSource.DEFAULT)
    if verbose or not chosen:
        configure(root.params.get("log_format"), "info" if verbose else "warning")


def _report(store, tenant: str, sweep_id: str, flag: str = "", judge_limits=None) -> str | None:
    """The table, the report's path and how to open it (nothing before the first complete job); why the sweep's
    judge sent nothing, where it did not (over `judge_limits`, the sweep file's: `judge.report.not_judged`)."""
    import shlex

    from controller.cli.table import echo_summary
    from controller.judge.report import not_judged
    from controller.report.api import with_extras
    from controller.report.compute.aggregate import summarize
    from controller.report.compute.columns import REFERENCE
    from controller.report.load.sweep import load_sweep
    from controller.report.render.write import write_reports
    from worker.core import paths

    data = load_sweep(store, tenant, sweep_id)
    if not data.results:
        return None
    # ratings and the sweep's judge, as `report` adds them
    summary = with_extras(summarize(data), store, data, judge_limits=judge_limits)
    keys = write_reports(store, tenant, sweep_id, summary, data)
    echo_summary(summary)
    where = location(store, keys.get("html", paths.report_key(tenant, sweep_id, "report.html")))
    click.echo(f"report: {where}")
    if store.url.startswith("file://"):
        opener = {"darwin": "open", "win32": "start"}.get(sys.platform, "xdg-open")
        click.echo(f"open it in a browser (it works offline): {opener} {shlex.quote(where)}")
    cells = int((summary["strategy"] != REFERENCE).sum())
    click.echo(f"next: decodebench report {sweep_id}{flag} --format csv --output summary.csv")
    click.echo(f"      decodebench rate export {sweep_id}{flag} --items {10 * cells} --raters 3  (10 per cell)")
    return not_judged(summary)


def _failures(outcome) -> None:
    """Each unavailable model once, with the job that failed to load it and its skipped jobs counted; other
    failures grouped by reason."""
    for path, reason in outcome.unavailable.items():
        failed = sum(1 for r in outcome.failed.values() if r == reason)
        skipped = sum(1 for p in outcome.blocked.values() if p == path)
        counts = [f"{n} {plural(n, 'job')} {how}" for n, how in ((failed, "failed"), (skipped, "skipped")) if n]
        if counts:  # (a model whose jobs were all complete already is not needed)
            click.echo(f"{terminal(reason)}; {', '.join(counts)}", err=True)
    by_reason: dict[str, list[str]] = {}
    for job_id, reason in outcome.failed.items():
        if reason not in outcome.unavailable.values():  # said once above
            by_reason.setdefault(reason, []).append(job_id)
    for reason, jobs in by_reason.items():
        ids = ", ".join(jobs[:3]) + (", ..." if len(jobs) > 3 else "")
        click.echo(f"failed {len(jobs)} {plural(len(jobs), 'job')} ({ids}): {terminal(reason)}", err=True)


@click.command()
def strategies() -> None:
    """List the registered decoding strategies and their parameters."""
    from worker.strategies import MODIFIERS, STRATEGIES

    for name, s in STRATEGIES.items():
        kind = "stochastic" if s.stochastic else "deterministic"
        origin = f", plugin {s.plugin}" if s.plugin else ""
        _wrapped(f"{name}  ({kind}{', ' + s.citation if s.citation else ''}{origin}): {s.description}", "", "    ")
        for pname, p in s.params.items():
            _wrapped(f"{pname}: {p.describe()}", "    ", "        ")
    click.echo("modifiers accepted by every strategy:")
    for pname, p in MODIFIERS.items():
        _wrapped(f"{pname}: {p.describe()}", "    ", "        ")
    _plugin_problems()


def _wrapped(text: str, first: str, rest: str) -> None:
    """One entry of `strategies` or `metrics`, wrapped to the terminal's width, its continuation indented."""
    import shutil

    width = max(40, shutil.get_terminal_size().columns - 1)
    click.echo(click.wrap_text(terminal(text), width, initial_indent=first, subsequent_indent=rest))


def _plugin_problems() -> None:
    """One line on stderr per strategy plugin that did not load (its entry point and why)."""
    from worker.strategies import PROBLEMS

    for problem in PROBLEMS:
        click.echo(terminal(problem.line), err=True)


def _values(bounds: tuple[float | None, float | None]) -> str:
    """A metric's `bounds` as the interval it takes values in ("; in [0, 100]", "; in [1, inf)"); none if unbounded."""
    low, high = bounds
    if low is None and high is None:
        return ""
    return f"; in {'(-inf' if low is None else f'[{low:g}'}, {'inf)' if high is None else f'{high:g}]'}"


def _interval(m) -> str:
    """How the report's interval of a metric is made, as `metrics` lists it: a share of 0/1 outcomes is exact
    where a prompt holds one (controller.report.stats.shares), Korn and Graubard's where it holds several."""
    if m.outcomes:
        return "interval exact (Clopper-Pearson) with one answer a prompt, Korn-Graubard's with several"
    from controller.metrics import ratio

    if m.interval == "bootstrap" and m.unit_interval and m.combine is ratio:
        return "bootstrap interval; exact (Clopper-Pearson) where each prompt holds one 0/1 outcome"
    return f"{m.interval} interval"


@click.command()
def metrics() -> None:
    """List the registered quality metrics with their metadata and interval method."""
    from controller.metrics import METRICS

    for name, m in METRICS.items():
        direction = {True: "higher is better", False: "lower is better", None: "no direction"}[m.higher_is_better]
        needs = [w for w, f in (("references", m.needs_references), ("model", m.needs_model),
                                ("answers", m.needs_answers)) if f]  # fmt: skip
        extra = (f"; needs {' and '.join(needs)}" if needs else "") + f"{_values(m.bounds)}; {_interval(m)}"
        cite = f", {m.citation}" if m.citation else ""
        _wrapped(f"{name}  ({m.level}, {direction}{extra}{cite}): {m.description}", "", "    ")
    for name, description in METRICS.families():
        example = f"{name.split('@')[0]}@8"
        _wrapped(f"{name}  (k a positive integer, e.g. {example}; needs answers): {description}", "", "    ")


COMMANDS = [validate, run, strategies, metrics]
