"""Every store path, built in one place (as rq's `key_for`). Same under file:// and s3://."""

from __future__ import annotations

import re

from worker.core.errors import UsageError, quote
from worker.core.settings import check_tenant

# Sweep and job ids are content hashes (16 hex digits); a given one may be a prefix. Anything
# else is refused in one line before it reaches a file name (a 5,000-character id would be
# an OSError "File name too long") or a message.
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# The report's files under <sweep>/report/, by format (`decodebench report --format`).
REPORT_FILES = {
    "md": "summary.md",
    "csv": "summary.csv",
    "parquet": "summary.parquet",
    "json": "summary.json",
    "html": "report.html",
}


def check_id(kind: str, value: str) -> str:
    """A sweep or job id (or a prefix of one) as given by a user: up to 64 letters, digits, '_'
    or '-'; else a UsageError (one line, exit 2)."""
    if not isinstance(value, str) or not _ID.fullmatch(value):  # fullmatch: `$` would pass "3f2a\n"
        raise UsageError(f"{kind} {quote(str(value), 40)} is not a {kind} id (up to 64 letters, digits, '_', '-')")
    return value


def sweep_prefix(tenant: str, sweep_id: str) -> str:
    return f"{check_tenant(tenant)}/sweeps/{check_id('sweep', sweep_id)}"


def sweeps_prefix(tenant: str) -> str:
    return f"{check_tenant(tenant)}/sweeps/"


def spec_key(tenant: str, sweep_id: str) -> str:
    return f"{sweep_prefix(tenant, sweep_id)}/spec.json"


def plan_key(tenant: str, sweep_id: str) -> str:
    return f"{sweep_prefix(tenant, sweep_id)}/plan.json"


def jobs_prefix(tenant: str, sweep_id: str) -> str:
    return f"{sweep_prefix(tenant, sweep_id)}/jobs/"


def job_prefix(tenant: str, sweep_id: str, job_id: str) -> str:
    return f"{sweep_prefix(tenant, sweep_id)}/jobs/{check_id('job', job_id)}"


def result_key(tenant: str, sweep_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant, sweep_id, job_id)}/result.json"


def generations_key(tenant: str, sweep_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant, sweep_id, job_id)}/generations.jsonl"


def log_key(tenant: str, sweep_id: str, job_id: str) -> str:
    return f"{job_prefix(tenant, sweep_id, job_id)}/log.jsonl"


def report_key(tenant: str, sweep_id: str, filename: str) -> str:
    return f"{sweep_prefix(tenant, sweep_id)}/report/{filename}"


def report_cache_key(tenant: str, sweep_id: str, name: str) -> str:
    """An entry of the report's content-addressed cache (a cell's output, a pair's comparison, a judge's reply)."""
    return report_key(tenant, sweep_id, f"cache/{name}")


JUDGE_VERDICTS_FILE = "judge-verdicts.jsonl"  # under report/: every verdict with its template hash


# Human ratings beside the sweep, one folder per round (`rate export`): its key (which hidden item is which
# cell) and one sheet per rater. Round "0" is the layout before rounds: ratings/key.json, ratings/sheets/.
RATINGS_KEY_FILE = "key.json"
LEGACY_ROUND = "0"
_ROUND = re.compile(r"^(0|[1-9][0-9]{0,8})$")


def check_round(round_id: str) -> str:
    """A rating round's id: a number (UsageError otherwise)."""
    if not isinstance(round_id, str) or not _ROUND.fullmatch(round_id):
        raise UsageError(f"rating round {round_id!r}: not a round id (a number)")
    return round_id


def ratings_prefix(tenant: str, sweep_id: str) -> str:
    return f"{sweep_prefix(tenant, sweep_id)}/ratings/"


def rating_rounds_prefix(tenant: str, sweep_id: str) -> str:
    return f"{ratings_prefix(tenant, sweep_id)}rounds/"


def rating_round_key(tenant: str, sweep_id: str, round_id: str, filename: str) -> str:
    """A file of a rating round: its `key.json`, or `sheets/<rater>.json`."""
    if check_round(round_id) == LEGACY_ROUND:
        return f"{ratings_prefix(tenant, sweep_id)}{filename}"
    return f"{rating_rounds_prefix(tenant, sweep_id)}{round_id}/{filename}"


def rater_sheet_key(tenant: str, sweep_id: str, round_id: str, rater: str) -> str:
    return rating_round_key(tenant, sweep_id, round_id, f"sheets/{rater}.json")


def rater_sheets_prefix(tenant: str, sweep_id: str, round_id: str) -> str:
    return rating_round_key(tenant, sweep_id, round_id, "sheets/")
