"""What a report computes, as one small task type: a cell's statistics, a pair's comparison, a share of the
judge's requests (controller.judge.jobs).

A task is what runs (optimum-benchmark's scenario); where it runs is the runner's backend
(controller.report.compute.runner: here, a process pool, or the cluster's report workers). Every
kind of task has:

- `digest`, `label`: its content digest and what a person reads for it (a report job's id and description);
- `name`: its entry in the report cache (controller.report.compute.cache), from the content digest
  of all it depends on; None where it cannot be cached;
- `run()`: its output, computed from its inputs and the store (the same numbers wherever it runs);
- `entry(output)` / `output(entry)`: the output as the cache's JSON and back (`Uncacheable` where an
  output must not be cached: a cell with a damaged job);
- `payload()`: what a report job carries to a report worker, ids and settings only, and the
  class's `refusal(doc, tenant)` (why such a payload must not run) and `from_payload(doc, store)` (the
  task rebuilt in the worker from its own store, checked against the payload);
- `portable`: whether it may run outside this process (only with the global registry's metrics,
  which a pool process or a report worker finds by name);
- `request()`: what the signer is asked to enqueue the tasks of its kind (`signer_call`, the body),
  and `answered(reply)`, the entry names the signer has jobs for.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Protocol

from worker.core.errors import PermanentJobError

MAX_N_BOOT = 100_000  # replicates a report job (a cell's, a pair's) may ask for
DIGEST = re.compile(r"[0-9a-f]{32}")  # a cell's or a pair's cache digest


class Uncacheable(PermanentJobError):
    """An output that must not enter the cache (and, in a report worker, fails its job), with why."""


class ReportTask(Protocol):
    kind: ClassVar[str]  # "cell", "pair", "judge": a report job's id starts with it
    prefix: ClassVar[str]  # the cache entry's name is prefix + digest ("", "pair-", "judgeshare-")
    digest_field: ClassVar[str]  # the payload's field that holds the digest (the worker names a failed job's entry)
    signer_call: ClassVar[str]  # the backend's method that enqueues this kind's jobs (controller.cli.backend)

    @property
    def digest(self) -> str | None: ...

    @property
    def name(self) -> str | None: ...

    @property
    def label(self) -> str | None: ...

    @property
    def portable(self) -> bool: ...

    def run(self) -> Any: ...

    def entry(self, output: Any) -> dict[str, Any]: ...

    def output(self, entry: dict[str, Any]) -> Any: ...

    def payload(self) -> dict[str, Any]: ...

    def request(self) -> tuple[str, dict[str, Any]] | None: ...

    @classmethod
    def answered(cls, reply: dict[str, Any]) -> set[str]: ...

    @classmethod
    def refusal(cls, doc: dict[str, Any], tenant: str) -> str | None: ...

    @classmethod
    def from_payload(cls, doc: dict[str, Any], store) -> ReportTask: ...


def bounded(doc: dict[str, Any], fields: tuple[str, ...], what: str) -> str | None:
    """Why a payload's replicate counts or seed are out of bounds (plain ints only), or None."""
    for name in fields:
        most = 2**63 if name == "seed" else MAX_N_BOOT
        if type(doc.get(name)) is not int or not 0 <= doc[name] <= most:
            return f"refused: the {what}'s {name} is out of bounds"
    return None


def plain(value: Any) -> Any:
    """A JSON value: NaN and infinities as null, numpy scalars as Python's."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value.item() if hasattr(value, "item") else value
