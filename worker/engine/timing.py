"""Timing one generate() call: its start, every decoding step, its end.

`StepClock` is a logits processor: generate() calls it once per decoding step, so the
first stamp marks the first logits (time to first token, i.e. prefill) and the number
of stamps is the number of steps. Decode time is derived, total - prefill, not guessed. Assisted
decoding stamps once, at the end of the model's first forward (worker.engine.generate), not per step:
its draft's generate() runs the same logits processors before the model's first logits.

- On CUDA every stamp is a CUDA event recorded on the current stream: recording is
  asynchronous, so timing adds no host synchronisation per token. `stop()` records the
  end event and synchronises once, then reads the intervals between events.
- On CPU the stamps are `time.perf_counter()` values.

A one-time cost inside a step that is not the step's work (a CUDA graph's capture, worker.engine.graphs) runs
`paused()`: its interval is stamped too, and every stamp after it is moved back by its length, so the
steps' times and the call's total are the steady state's; the caller records the cost itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessor


@dataclass(frozen=True)
class StepTimes:
    """Seconds from the start of the call to its first logits and to its end; steps stamped."""

    prefill_s: float
    total_s: float
    steps: int
    marks: list[float] = field(default_factory=list)  # seconds from the start to each `mark()`
    step_s: list[float] = field(default_factory=list)  # seconds from the start to each step's stamp


class StepClock(LogitsProcessor):
    """Stamps the start, every decoding step and the end of one call; changes no score."""

    def __init__(self, device) -> None:
        self.cuda = device.type == "cuda"
        self._start = None
        self._steps: list = []
        self._marks: list = []
        self._pauses: list = []  # (stamp, stamp) around what `paused` leaves out

    def _stamp(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a

    def start(self) -> None:
        self._steps = []
        self._pauses = []
        self._start = self._stamp()
        self._marks = [self._start]

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave what runs inside out of every later stamp (a one-time cost the caller records itself)."""
        before = self._stamp()
        try:
            yield
        finally:
            self._pauses.append((before, self._stamp()))

    def mark(self) -> int:
        """Stamp a moment (a row's start or first token); its index into `StepTimes.marks`."""
        self._marks.append(self._stamp())
        return len(self._marks) - 1

    def tick(self) -> None:
        """Stamp a decoding step (the engine's decode loop, once its logits are asked for)."""
        self._steps.append(self._stamp())

    def __call__(self, input_ids, scores):  # as generate()'s logits processor
        self._steps.append(self._stamp())
        return scores

    def stop(self) -> StepTimes:
        """End the call: on CUDA the one synchronisation of the batch happens here."""
        end = self._stamp()
        if self.cuda:
            end.synchronize()
        pauses = [(self._seconds(self._start, a), self._seconds(a, b)) for a, b in self._pauses]

        def since(stamp) -> float:  # seconds from the start, the pauses before the stamp left out
            at = self._seconds(self._start, stamp)
            return at - sum(length for begun, length in pauses if begun + length <= at)

        total = since(end)
        marks = [since(m) for m in self._marks]
        step_s = [since(s) for s in self._steps]
        prefill = step_s[0] if step_s else total  # the first step's stamp is the first logits
        return StepTimes(prefill_s=prefill, total_s=total, steps=len(step_s), marks=marks, step_s=step_s)


def synchronize(device) -> None:
    """Wait for the device's queued work (after a warm-up, before memory readings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
