"""`decodebench rate export|import`: blinded human-rating sheets out, returned sheets in."""

from __future__ import annotations

from pathlib import Path

import click

from controller.cli import options
from worker.core import settings
from worker.core.errors import UsageError


@click.group("rate")
def rate() -> None:
    """Human evaluation: blinded rating sheets and their returned scores."""


def _names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@rate.command("export")
@click.argument("sweep")
@click.option("--items", "n_items", type=click.IntRange(min=1), required=True, help="Generations to rate, over cells.")
@click.option("--raters", type=click.IntRange(min=1), default=None, help="Number of raters (named r1..rN).")
@click.option("--rater-names", default=None, help="Comma-separated rater names instead of --raters.")
@click.option("--criteria", default="fluency,coherence", show_default=True, help="Comma-separated criteria (1-5).")
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Make the export reproducible (and replayable by anyone with the seed); default: a secret draw.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder of the sheets (./ratings-SWEEP).",
)
@settings.option("store", "--store", "store_url")
@options.tenant
def export(sweep, n_items, raters, rater_names, criteria, seed, out, store_url, tenant) -> None:
    """Write blinded sheets (CSV and an offline HTML page per rater); the key stays beside the sweep."""
    from controller.report.aggregate import load_sweep
    from controller.report.rating_sheets import export_sheets, sheet_csv, sheet_html
    from controller.report.ratings import load_sheets
    from worker.core import paths
    from worker.store import open_store

    names = _names(rater_names) if rater_names else [f"r{i}" for i in range(1, (raters or 0) + 1)]
    if not names:
        raise UsageError("give --raters N or --rater-names a,b,...")
    store = open_store(store_url)
    sweep_id = store.resolve_sweep(tenant, sweep)
    if load_sheets(store, tenant, sweep_id):
        raise UsageError(f"sweep {sweep_id} already has imported ratings; a new export would orphan them")
    if seed is not None:
        click.echo(
            "warning: --seed makes the sheets reproducible; anyone with the seed and the sweep can recover "
            "which item is which cell",
            err=True,
        )
    sheets = export_sheets(load_sweep(store, tenant, sweep_id), n_items, names, _names(criteria), seed)
    store.write_json(paths.ratings_key(tenant, sweep_id, paths.RATINGS_KEY_FILE), sheets.key)
    out = out or Path(f"ratings-{sweep_id}")
    out.mkdir(parents=True, exist_ok=True)
    for rater, items in sheets.items.items():
        (out / f"sheet-{rater}.csv").write_bytes(sheet_csv(rater, items, sheets.key["criteria"]))
        (out / f"sheet-{rater}.html").write_bytes(sheet_html(rater, items, sheets.key["criteria"]))
    n_controls = sheets.key["n_controls"]
    click.echo(
        f"{len(sheets.key['items'])} items ({n_controls} of them references mixed in as controls) "
        f"for {len(names)} raters in {out}/"
    )


@rate.command("import")
@click.argument("sweep")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@settings.option("store", "--store", "store_url")
@options.tenant
def import_(sweep, files, store_url, tenant) -> None:
    """Validate returned sheets (all or none) and store them beside the sweep; `report` then shows them."""
    from controller.report.ratings import import_sheets
    from worker.store import open_store

    store = open_store(store_url)
    sweep_id = store.resolve_sweep(tenant, sweep)
    counts = import_sheets(store, tenant, sweep_id, [(str(f), f.read_bytes()) for f in files])
    for rater, n in sorted(counts.items()):
        click.echo(f"{rater}: {n} items")


COMMANDS = [rate]
