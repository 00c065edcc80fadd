"""`decodebench report`'s progress on stderr, phase by phase: the results read, the cells, the pairs, the judges.

The report code calls `tick(what, done, total)` (controller.report: `load_sweep`, and the runner of
the cells and the pairs, `compute.runner`) from its main thread; on a terminal each phase is a rich
bar, otherwise a line `report: cells 200/2000 (1m05s)` every tenth of a phase and at its end (as `run` prints its
jobs), and `--no-progress` prints nothing. stdout keeps the summary table alone.
"""

from __future__ import annotations

import contextlib
import sys


def progress_mode(no_progress: bool) -> bool | None:
    """What `run` and `report` show on stderr: a bar at a terminal (True), else lines (None); False: nothing."""
    return False if no_progress else (True if sys.stderr.isatty() else None)


class ReportProgress:
    """A context manager giving `tick(what, done, total)`: `enabled` True a bar, None lines, False nothing."""

    def __init__(self, enabled: bool | None) -> None:
        from controller.launch.local import tenth_lines

        self.enabled = enabled
        self.lines = tenth_lines("report: {what} {done}/{total} ({elapsed})")  # without a TTY
        self.tasks: dict[str, int] = {}
        self.bar = None
        self.stack = contextlib.ExitStack()

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

            from controller.launch.local import stderr_bar

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self.bar = self.stack.enter_context(stderr_bar(*columns))
        return self.tick

    def tick(self, what: str, done: int, total: int) -> None:
        if self.enabled is False or total <= 0:
            return
        if self.bar is not None:
            if what not in self.tasks:
                self.tasks[what] = self.bar.add_task(what, total=total)
            self.bar.update(self.tasks[what], completed=done, total=total)
            return
        self.lines(what, done, total)

    def __exit__(self, *exc) -> None:
        self.stack.close()
