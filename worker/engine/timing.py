"""Timing one generate() call: its start, every decoding step, its end.

`StepClock` is a logits processor: generate() calls it once per decoding step, so the
first stamp marks the first logits (time to first token, i.e. prefill) and the number
of stamps is the number of steps. Decode time is derived, total - prefill, not guessed.

- On CUDA every stamp is a CUDA event recorded on the current stream: recording is
  asynchronous, so timing adds no host synchronisation per token. `stop()` records the
  end event and synchronises once, then reads the intervals between events.
- On CPU the stamps are `time.perf_counter()` values.
"""

from __future__ import annotations

import time
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
        self._start = self._stamp()
        self._marks = [self._start]

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
        total = self._seconds(self._start, end)
        marks = [self._seconds(self._start, m) for m in self._marks]
        step_s = [self._seconds(self._start, s) for s in self._steps]
        prefill = step_s[0] if step_s else total  # the first step's stamp is the first logits
        return StepTimes(prefill_s=prefill, total_s=total, steps=len(step_s), marks=marks, step_s=step_s)


def synchronize(device) -> None:
    """Wait for the device's queued work (after a warm-up, before memory readings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
