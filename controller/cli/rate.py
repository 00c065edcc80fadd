"""`decodebench rate export|import`: blinded human-rating sheets out, returned sheets in."""

from __future__ import annotations

from pathlib import Path

import click

from controller.cli import options
from controller.cli.options import store_flag
from controller.sweep.wording import plural
from worker.core import settings
from worker.core.errors import UsageError
from worker.core.safetext import terminal


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
    "--define",
    "defines",
    multiple=True,
    metavar="NAME=TEXT",
    help="What a criterion asks, shown on the sheets (fluency and coherence have one built in).",
)
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
    help="Folder of the sheets (./ratings-SWEEP-round-N).",
)
@settings.option("store", "--store", "store_url")
@options.tenant
def export(sweep, n_items, raters, rater_names, criteria, defines, seed, out, store_url, tenant) -> None:
    """Write blinded sheets (CSV and an offline HTML page per rater); the key stays beside the sweep."""
    from controller.report.compute.columns import REFERENCE
    from controller.report.load.sweep import load_sweep
    from controller.report.ratings.scores import next_round
    from controller.report.ratings.sheets import definitions_for, export_sheets, instructions, sheet_csv, sheet_html
    from worker.core import paths
    from worker.store import open_store

    names = _names(rater_names) if rater_names else [f"r{i}" for i in range(1, (raters or 0) + 1)]
    given = dict(d.split("=", 1) for d in defines if "=" in d)
    if len(given) != len(defines):
        raise UsageError("--define takes NAME=TEXT")
    if not names:
        raise UsageError("give --raters N or --rater-names a,b,...")
    store = open_store(store_url)
    sweep_id = store.resolve_sweep(tenant, sweep)
    if seed is not None:
        click.echo(
            "warning: --seed makes the sheets reproducible; anyone with the seed and the sweep can recover "
            "which item is which cell",
            err=True,
        )
    round_id = next_round(store, tenant, sweep_id)  # a new round: no earlier export's key is ever replaced
    data = load_sweep(store, tenant, sweep_id)
    sheets = export_sheets(data, n_items, names, _names(criteria), seed, round_id=round_id)
    if not store.write_json(paths.rating_round_key(tenant, sweep_id, round_id, paths.RATINGS_KEY_FILE), sheets.key,
                            create_only=True):  # fmt: skip
        raise UsageError(f"sweep {sweep_id}: another export took rating round {round_id} meanwhile; run it again")
    out = out or Path(f"ratings-{sweep_id}-round-{round_id}")
    out.mkdir(parents=True, exist_ok=True)
    crits = sheets.key["criteria"]
    defined = definitions_for(crits, given)
    for rater, items in sheets.items.items():
        (out / f"sheet-{rater}.csv").write_bytes(sheet_csv(rater, items, crits))
        (out / f"sheet-{rater}.html").write_bytes(sheet_html(rater, items, crits, defined))
    n = len(sheets.key["items"])
    (out / "instructions.txt").write_text(instructions(crits, defined, n))
    controls = sum(1 for where in sheets.key["items"].values() if where["cell"] == REFERENCE)
    cells = len({where["cell"] for where in sheets.key["items"].values()} - {REFERENCE})
    click.echo(
        f"rating round {round_id}: {n} {plural(n, 'item')} for {len(names)} {plural(len(names), 'rater')} in "
        f"{terminal(str(out))}/: "
        f"{n - controls} {plural(n - controls, 'generation')} over {cells} {plural(cells, 'cell')}, and "
        f"{controls} reference {plural(controls, 'text')} of the same prompts mixed in as controls"
    )
    click.echo(f"criteria and scale: {terminal(str(out / 'instructions.txt'))}")
    then = f"decodebench rate import {sweep_id} FILES...{store_flag(store_url)}"
    click.echo(f"next: send each rater their sheet; then {then}")


@rate.command("import")
@click.argument("sweep")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@settings.option("store", "--store", "store_url")
@options.tenant
def import_(sweep, files, store_url, tenant) -> None:
    """Validate returned sheets (all or none) and store them beside the sweep; `report` then shows them."""
    from controller.report.ratings.scores import import_sheets, read_sheet_file, rounds
    from worker.store import open_store

    store = open_store(store_url)
    sweep_id = store.resolve_sweep(tenant, sweep)
    imported = import_sheets(store, tenant, sweep_id, [read_sheet_file(f) for f in files])
    keys = rounds(store, tenant, sweep_id)
    for (round_id, rater), (n, replaced) in sorted(imported.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        again = f" (replaces the sheet imported from {terminal(replaced)})" if replaced else ""
        blanks = _blanks(store, tenant, sweep_id, round_id, rater, keys.get(round_id) or {})
        click.echo(f"{rater}: {n} {plural(n, 'item')} of round {round_id}{again}{blanks}")
    click.echo(f"next: decodebench report {sweep_id}{store_flag(store_url)} (adds the ratings to the report)")


def _blanks(store, tenant: str, sweep_id: str, round_id: str, rater: str, key: dict) -> str:
    """`; 3 scores left blank (not rated)`: a blank is no score, never a silent zero, and the rater is told."""
    from worker.core import paths

    scores = store.read_json(paths.rater_sheet_key(tenant, sweep_id, round_id, rater)).get("scores", {})
    criteria = key.get("criteria", [])
    blank = sum(len(criteria) - len(scores.get(item, {})) for item in key.get("items", {}))
    return f"; {blank} {plural(blank, 'score')} left blank (not rated)" if blank else ""


COMMANDS = [rate]
