"""Local commands: validate, run (in-process, no Redis), strategies, metrics."""

from __future__ import annotations

import json
import sys

import click

from controller.cli import options
from worker.core import settings
from worker.core.errors import UsageError


@click.command()
@click.argument("spec_path", metavar="SPEC", required=False)
@click.option("--schema", is_flag=True, help="Print the JSON schema of sweep specs and exit.")
@options.tenant
@click.option("--jobs", "show_jobs", is_flag=True, help="List every job.")
def validate(spec_path: str | None, schema: bool, tenant: str, show_jobs: bool) -> None:
    """Check a sweep spec and print its job plan."""
    from controller.spec.load import load_spec
    from controller.spec.models import json_schema
    from controller.spec.plan import plan, summarize_plan
    from worker.core.policy import Limits, job_refusal

    if schema:
        click.echo(json.dumps(json_schema(), indent=2))
        return
    if not spec_path:
        raise UsageError("validate: give a SPEC file (or --schema)")
    spec = load_spec(spec_path)
    jobs = plan(spec, tenant)
    limits = Limits.from_settings()  # the per-job limits the submission server and workers apply
    if why := next((w for j in jobs if (w := job_refusal(j, None, limits))), None):
        raise UsageError(why)
    s = summarize_plan(jobs)
    click.echo(f"{spec_path}: valid")
    click.echo(
        f"sweep {s.sweep_id}: {s.cells} cells, {s.jobs} jobs, {s.prompts} prompts, "
        f"{s.generations} generations, up to {s.tokens_to_generate:,} tokens to generate"
    )
    click.echo(f"limit: {settings.get('max_jobs'):,} jobs per sweep (DECODEBENCH_MAX_JOBS)")
    cells: dict[str, list] = {}
    for j in jobs:
        cells.setdefault(j.cell, []).append(j)
    for cell, cjobs in cells.items():
        seeds = sorted({j.seed for j in cjobs})
        click.echo(f"  {cell}: {len(cjobs)} jobs, seeds {seeds}")
        if show_jobs:
            for j in cjobs:
                click.echo(f"    {j.job_id}  seed={j.seed} shard={j.shard}/{j.n_shards} prompts={len(j.prompts)}")


@click.command()
@click.argument("spec_path", metavar="SPEC")
@settings.option("store", "--store", "--out")
@settings.option("device", default="cpu", help="Device: cpu or cuda:N; never falls back silently.")
@options.tenant
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def run(spec_path: str, store: str, device: str, tenant: str, no_progress: bool) -> None:
    """Run a sweep locally, in-process, then print the comparison."""
    from controller.launch.local import run_sweep
    from controller.report.aggregate import load_sweep, summarize
    from controller.report.format import markdown_table
    from controller.report.write import write_reports
    from controller.spec.load import load_spec
    from worker.store import open_store

    settings.parse_device(device)
    spec = load_spec(spec_path)
    opened = open_store(store)
    outcome = run_sweep(spec, opened, tenant=tenant, device=device, progress=not no_progress and sys.stderr.isatty())
    click.echo(
        f"sweep {outcome.sweep_id}: {len(outcome.ran)} jobs run, {len(outcome.skipped)} already complete, "
        f"{len(outcome.failed)} failed; store {opened.url}"
    )
    data = load_sweep(opened, tenant, outcome.sweep_id)
    if data.results:
        summary = summarize(data)
        write_reports(opened, tenant, outcome.sweep_id, summary, data)
        click.echo(markdown_table(summary))
    for job_id, reason in outcome.failed.items():
        click.echo(f"failed {job_id}: {reason}", err=True)
    if outcome.failed:
        sys.exit(1)


@click.command()
def strategies() -> None:
    """List the registered decoding strategies and their parameters."""
    from worker.strategies import MODIFIERS, STRATEGIES

    for name, s in STRATEGIES.items():
        kind = "stochastic" if s.stochastic else "deterministic"
        click.echo(f"{name}  ({kind}{', ' + s.citation if s.citation else ''}): {s.description}")
        for pname, p in s.params.items():
            click.echo(f"    {pname}: {p.describe()}")
    click.echo("modifiers accepted by every strategy:")
    for pname, p in MODIFIERS.items():
        click.echo(f"    {pname}: {p.describe()}")


@click.command()
def metrics() -> None:
    """List the registered quality metrics with their metadata and interval method."""
    from controller.metrics import METRICS

    for name, m in METRICS.items():
        direction = {True: "higher is better", False: "lower is better", None: "no direction"}[m.higher_is_better]
        needs = [w for w, f in (("references", m.needs_references), ("model", m.needs_model)) if f]
        extra = (f"; needs {' and '.join(needs)}" if needs else "") + f"; {m.interval} interval"
        click.echo(f"{name}  ({m.level}, {direction}{extra}{', ' + m.citation if m.citation else ''}): {m.description}")


COMMANDS = [validate, run, strategies, metrics]
