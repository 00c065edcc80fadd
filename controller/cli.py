"""The `decodebench` command line (click). User errors print one line and exit non-zero."""

from __future__ import annotations

import json
import sys

import click

from controller.settings import configured_store, setting
from worker.errors import DecodebenchError


class Group(click.Group):
    """Turns a DecodebenchError into one line on stderr and its exit code (2 for bad input)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DecodebenchError as err:
            click.echo(f"error: {err}", err=True)
            ctx.exit(err.exit_code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-format", type=click.Choice(["console", "json"]), default=None,
              help="Log format (env DECODEBENCH_LOG_FORMAT; default console).")
@click.option("--log-level", default=None, help="Log level (env DECODEBENCH_LOG_LEVEL; default info).")
@click.version_option(package_name="decodebench")
def main(log_format: str | None, log_level: str | None) -> None:
    """Compare text-generation decoding strategies across language models."""
    from worker.logs import configure

    configure(setting("log_format", log_format), log_level)


@main.command()
@click.argument("spec_path", metavar="SPEC", required=False)
@click.option("--schema", is_flag=True, help="Print the JSON schema of sweep specs and exit.")
@click.option("--tenant", default=None, help="Tenant (env DECODEBENCH_TENANT; default 'default').")
@click.option("--jobs", "show_jobs", is_flag=True, help="List every job.")
def validate(spec_path: str | None, schema: bool, tenant: str | None, show_jobs: bool) -> None:
    """Check a sweep spec and print its job plan."""
    from controller.plan import plan, summarize_plan
    from controller.spec import json_schema, load_spec
    from worker.errors import UsageError

    if schema:
        click.echo(json.dumps(json_schema(), indent=2))
        return
    if not spec_path:
        raise UsageError("validate: give a SPEC file (or --schema)")
    spec = load_spec(spec_path)
    jobs = plan(spec, setting("tenant", tenant))
    s = summarize_plan(jobs)
    click.echo(f"{spec_path}: valid")
    click.echo(f"sweep {s.sweep_id}: {s.cells} cells, {s.jobs} jobs, {s.prompts} prompts, "
               f"{s.generations} generations, up to {s.tokens_to_generate:,} tokens to generate")
    cells: dict[str, list] = {}
    for j in jobs:
        cells.setdefault(j.cell, []).append(j)
    for cell, cjobs in cells.items():
        seeds = sorted({j.seed for j in cjobs})
        click.echo(f"  {cell}: {len(cjobs)} jobs, seeds {seeds}")
        if show_jobs:
            for j in cjobs:
                click.echo(f"    {j.job_id}  seed={j.seed} shard={j.shard}/{j.n_shards} prompts={len(j.prompts)}")


@main.command()
@click.argument("spec_path", metavar="SPEC")
@click.option("--out", default=None, help="Store: a directory, file:// or s3:// URL (env DECODEBENCH_STORE; default ./runs).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda:N; never falls back silently.")
@click.option("--tenant", default=None, help="Tenant (env DECODEBENCH_TENANT; default 'default').")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def run(spec_path: str, out: str | None, device: str, tenant: str | None, no_progress: bool) -> None:
    """Run a sweep locally, in-process, then print the comparison."""
    from controller.aggregate import load_sweep, summarize
    from controller.local import run_sweep
    from controller.report import markdown_table, write_reports
    from controller.spec import load_spec
    from worker.device import parse_device

    parse_device(device)
    spec = load_spec(spec_path)
    store = configured_store(out)
    tenant = setting("tenant", tenant)
    outcome = run_sweep(spec, store, tenant=tenant, device=device, progress=not no_progress and sys.stderr.isatty())
    click.echo(f"sweep {outcome.sweep_id}: {len(outcome.ran)} jobs run, {len(outcome.skipped)} already complete, "
               f"{len(outcome.failed)} failed; store {store.url}")
    data = load_sweep(store, tenant, outcome.sweep_id)
    if data.results:
        summary = summarize(data)
        write_reports(store, tenant, outcome.sweep_id, summary, data)
        click.echo(markdown_table(summary))
    for job_id, reason in outcome.failed.items():
        click.echo(f"failed {job_id}: {reason}", err=True)
    if outcome.failed:
        sys.exit(1)


@main.command()
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


@main.command()
def metrics() -> None:
    """List the registered quality metrics with their metadata."""
    from worker.metrics import METRICS

    for name, m in METRICS.items():
        direction = {True: "higher is better", False: "lower is better", None: "no direction"}[m.higher_is_better]
        needs = [w for w, f in (("references", m.needs_references), ("model", m.needs_model)) if f]
        extra = f"; needs {' and '.join(needs)}" if needs else ""
        click.echo(f"{name}  ({m.level}, {direction}{extra}{', ' + m.citation if m.citation else ''}): {m.description}")


from controller.cluster import cluster  # noqa: E402
from controller.commands import COMMANDS  # noqa: E402  (distributed mode: submit, status, cancel, retry, logs, doctor)
from controller.report import report  # noqa: E402

for _command in (*COMMANDS, report, cluster):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
