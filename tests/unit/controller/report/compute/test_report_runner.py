"""The report's one runner (controller.report.compute.runner, issue 40 item 1): any report task, from the
content cache, else from the remote backend, else computed here; each output cached once, in order of
arrival, with a progress that never runs backwards. A toy task kind stands for a cell or a pair."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from controller.report.compute.cache import ReportCache
from controller.report.compute.runner import Runner
from controller.report.compute.tasks import Uncacheable
from worker.store import FileStore

pytestmark = pytest.mark.pure
RAN: list[int] = []  # the tasks run in this process


@dataclass
class Square:
    """A toy report task: its number squared; 13 is unlucky (not cached), `local` ones use a metric of their own."""

    kind: ClassVar[str] = "square"
    signer_call: ClassVar[str] = "report_squares"
    n: int
    local: bool = False

    @property
    def digest(self) -> str:
        return f"{self.n:032x}"

    name = digest
    label = digest

    @property
    def portable(self) -> bool:
        return not self.local

    def run(self) -> int:
        RAN.append(self.n)
        return self.n * self.n

    def entry(self, output: int) -> dict[str, Any]:
        if self.n == 13:
            raise Uncacheable("unlucky")
        return {"square": output}

    def output(self, entry: dict[str, Any]) -> int:
        return entry["square"]

    def request(self):
        return "sweep", {}

    @staticmethod
    def answered(reply: dict[str, Any]) -> set[str]:
        return set(reply["names"])


class Workers:
    """A remote backend whose 'workers' write the entries of the even squares it is asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def compute(self, tasks, cache: ReportCache, what: str):
        for i, task in enumerate(tasks, 1):
            self.asked.append(task.n)
            if task.n % 2 == 0:
                cache.write(task.name, {"square": task.n * task.n})
                yield i


@pytest.fixture
def cache(tmp_path) -> ReportCache:
    RAN.clear()
    return ReportCache(FileStore(tmp_path / "s"), "default", "sweep0000000000a")


def test_cached_then_remote_then_here_each_output_once_and_cached(cache):
    cache.write(Square(1).name, {"square": 1})
    ticks: list[tuple] = []
    workers = Workers()
    tasks = [Square(n) for n in (1, 2, 3, 4, 13)]
    got = dict(Runner(remote=workers, progress=lambda *t: ticks.append(t)).run(tasks, cache, "squares"))
    assert got == {0: 1, 1: 4, 2: 9, 3: 16, 4: 169}
    assert workers.asked == [2, 3, 4, 13]  # not the cached one
    assert RAN == [3, 13]  # what the workers did not deliver, computed here
    listing = cache.listing()
    assert all(cache.holds(listing, t.name) for t in tasks if t.n != 13) and not cache.holds(listing, Square(13).name)
    done = [d for _, d, _ in ticks]
    assert done == sorted(done) and done[-1] == 5 and all(w == "squares" and total == 5 for w, _, total in ticks)

    RAN.clear()
    again = dict(Runner(remote=workers).run(tasks, cache, "squares"))
    assert again == got and RAN == [13]  # everything from the cache but the uncacheable one


def test_a_task_with_metrics_of_its_own_never_leaves_this_process(cache):
    workers = Workers()
    got = dict(Runner(workers=2, remote=workers).run([Square(2, local=True), Square(3, local=True)], cache, "squares"))
    assert got == {0: 4, 1: 9} and workers.asked == [] and RAN == [2, 3]  # here, not remote, not in a pool


def test_a_damaged_entry_is_computed_again_and_no_cache_means_computed_here(cache):
    cache.store.write_bytes(cache.key(Square(5).name), b"{not json")
    assert dict(Runner().run([Square(5)], cache, "squares")) == {0: 25} and RAN == [5]
    assert cache.read(Square(5).name) == {"square": 25}
    RAN.clear()
    assert dict(Runner(remote=Workers()).run([Square(6)], None, "squares")) == {0: 36} and RAN == [6]
