"""Sizing a job's batches: length buckets in, the shard's order out, and `batch_size: auto`.

`buckets(lengths, size)` sorts the prompts by token length (longest first, ties in the
shard's order) before cutting batches, so a batch pads its prompts to nearly the same
length; the job puts the generations back in the shard's order. A job has one strategy
variant and one set of generation settings, so a batch never mixes settings.

`auto_batch_size(runtime, lm, plan, job, lengths)` finds the batch size for `batch_size: auto`
(and `auto_groups`, a job's groups of length buckets with their sizes):

- on CUDA, the largest batch that fits, doubling from 1 until out-of-memory, then bisecting
  back (backoff) between the last size that fitted and the first that did not. Where the
  engine's decode loop runs over its preallocated KV cache, the probe is that loop's peak
  (`probe_step`): B rows of buffers of the planned columns (times the beams a prompt
  carries), a prefill of the longest prompt's bucket into them (for a stream, an
  admission's prefill into a cache of its own as well), a decode step and the sampling
  step's vocabulary-sized tensors; the batch then takes HEADROOM (90%) of what
  fitted. Elsewhere (generate(), transformers' own cache) it is one forward pass of B
  copies of the longest prompt padded to prompt + max_new_tokens, which holds more than
  that cache and its activations ever do;
- on CPU, where memory is not what limits, the size with the best tokens/s in a short
  timed probe (a few decoding steps of the longest prompts), doubling while it improves
  (a size that looks no faster is timed again with the best before the search stops).

Both stop at the shard's size and at `DECODEBENCH_AUTO_BATCH_MAX` (the runtime's settings). The answer is cached
per (model, device, prompt-length bucket, max_new_tokens, rows per prompt) in the
runtime, and what was probed is recorded in the result (the job's batch plan: worker.engine.job).

On CUDA a job's prompts are probed per length bucket as well (`length_groups`): where the
rest of the job fits clearly more rows than its longest prompts, it runs as a group of its
own at that size (each group its own batches or stream), so that one long prompt does not
set the batch size of a job of short ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from worker.core.contract import JobSpec
from worker.engine import generate as gen
from worker.engine.call import ModelCall
from worker.engine.decode import stream_span
from worker.engine.kvcache import preallocated_cache
from worker.engine.models import LoadedModel
from worker.engine.plan import Cache, Path, Plan
from worker.engine.rows import Ends, Rows

log = structlog.get_logger("decodebench.batching")

CPU_PROBE_STEPS = 8


def longest_first(lengths: list[int]) -> list[int]:
    """Indices of the prompts, longest first, ties in the shard's order."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def cut(order: list[int], size: int) -> list[list[int]]:
    """`order` in batches of `size` (the last may be smaller)."""
    return [order[i : i + size] for i in range(0, len(order), size)]


def buckets(lengths: list[int], size: int) -> list[list[int]]:
    """Indices of the prompts, sorted longest first, cut into batches of `size`."""
    return cut(longest_first(lengths), size)


def length_bucket(n: int) -> int:
    """The power of two at or above n: prompts of similar length share a cached batch size."""
    return 1 << max(n - 1, 0).bit_length()


def length_groups(lengths: list[int], size_for: Callable[[list[int]], int]) -> list[tuple[int, list[int]]]:
    """The prompts, longest first, in groups that each run at their own batch size: (size, indices).

    Where memory sets the batch size (CUDA), shorter prompts fit more rows. The sorted prompts
    are cut at each change of length bucket; `size_for(lengths)` is the size that fits the
    bucket's prompts and every shorter one (the probe plans for the bucket's longest). A
    bucket starts a group of its own only where that pays: a new group costs about one
    generation's steps (the group before it drains: its last rows finish while no prompt
    comes to replace them), and running the n prompts left at size S' instead of the current
    S saves about n/S - n/S' generations' steps. So a bucket with a larger size starts a group
    where n (1/S - 1/S') >= 1; any other joins the group before it, whose rows its shorter
    prompts fit.
    """
    order = longest_first(lengths)
    starts = [
        i
        for i in range(len(order))
        if i == 0 or length_bucket(lengths[order[i]]) != length_bucket(lengths[order[i - 1]])
    ]
    groups: list[tuple[int, list[int]]] = []
    for start, end in zip(starts, [*starts[1:], len(order)]):
        rest = order[start:]
        if not groups or len(rest) > groups[-1][0]:  # else n <= S: no size saves a generation's steps
            size = size_for([lengths[i] for i in rest])
            if not groups or len(rest) * (size - groups[-1][0]) >= groups[-1][0] * size:  # n (1/S - 1/S') >= 1
                groups.append((size, order[start:end]))
                continue
        groups[-1][1].extend(order[start:end])
    return groups


@dataclass(frozen=True)
class LoopPeak:
    """What the engine's decode loop holds at its peak besides its KV buffers: a prefill of `prompt` tokens
    (the longest prompt's bucket) and, for a continuous-refill stream, the newcomers' own cache of their
    prompts beside the stream's buffers (an admission, before the merge copies them in)."""

    prompt: int
    stream: bool = False


def probe_step(call: ModelCall, rows: int, length: int, peak: LoopPeak | None, device):
    """What a batch of `rows` rows holds at its peak, allocated and run once through the decode loop's model
    call (worker.engine.call); the KV cache it filled (with `peak`; None without), for a look.

    With `peak` (the engine's decode loop, whose KV cache is allocated once: kvcache), the
    buffers of `length` columns, a prefill of the prompt into them, for a stream a second
    prefill into the newcomers' own cache while the buffers are held, one decode step, and
    the sampling step's vocabulary-sized tensors (the float64 CDF, a sort's values and
    indices). Without (generate(), whose cache grows by concatenation, and the decode loop over
    transformers' own cache), one forward pass of `length` tokens, which holds more than that cache and
    its activations ever do.
    """
    with torch.inference_mode():
        if peak is None:
            ids = torch.zeros((rows, length), dtype=torch.long, device=device)
            call.prefill(Rows(ids, torch.ones_like(ids), _PROBE_ENDS), None)
            return None
        ids = torch.zeros((rows, peak.prompt), dtype=torch.long, device=device)
        batch = Rows(ids, torch.ones_like(ids), _PROBE_ENDS)
        cache = preallocated_cache(call.model, length, rows)
        call.prefill(batch, cache)
        if peak.stream:  # an admission of `rows` newcomers, whose prefill goes to a cache of their own
            call.prefill(batch, preallocated_cache(call.model, peak.prompt, rows))
        batch.append(ids[:, 0])
        out, _ = call.forward(batch, cache)
        logits = out.logits[:, -1].float()
        ranked = torch.sort(logits, dim=-1)
        cdf = logits.double().cumsum(dim=-1)
        del ranked, cdf
        return cache


_PROBE_ENDS = Ends([], 0, 1)  # the probe's rows: one new token, no EOS


def _fits(call: ModelCall, rows: int, length: int, device, peak: LoopPeak | None = None) -> bool:
    """`probe_step` on a CUDA device: False on out-of-memory."""
    try:
        probe_step(call, rows, length, peak, device)
        torch.cuda.synchronize(device)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        torch.cuda.empty_cache()


HEADROOM = 0.9  # of the rows that fitted the decode loop's peak, what a batch uses (see cuda_fit)


def cuda_fit(call: ModelCall, device, length: int, rows_each: int, cap: int, peak: LoopPeak | None = None):
    """The largest batch (<= cap) whose probe fits, doubling then bisecting; and what was probed.

    With `peak`, the probe holds the decode loop's real peak (`probe_step`), not a bound above
    it, so where memory and not the cap stops the search, the batch takes HEADROOM of the
    rows that fitted: room for what the probe does not hold (the allocator's fragmentation
    over a stream's admissions, the host copies of finished batches)."""
    probed: dict[int, bool] = {}
    good, bad, size = 0, None, 1
    while size <= cap:
        probed[size] = _fits(call, size * rows_each, length, device, peak)
        if not probed[size]:
            bad = size
            break
        good, size = size, size * 2
    if bad is None and good < cap:  # the cap itself, if doubling stepped over it
        probed[cap] = _fits(call, cap * rows_each, length, device, peak)
        good, bad = (cap, None) if probed[cap] else (good, cap)
    while bad is not None and bad - good > 1:  # backoff: bisect between what fitted and what did not
        mid = (good + bad) // 2
        probed[mid] = _fits(call, mid * rows_each, length, device, peak)
        good, bad = (mid, bad) if probed[mid] else (good, mid)
    if bad is not None and peak is not None:
        good = int(good * HEADROOM)
    return max(good, 1), probed


def cpu_fastest(run: Callable[[int], float], cap: int) -> tuple[int, dict[int, float]]:
    """The size with the best tokens/s from `run(size)` (seconds per token), doubling while it improves.

    A size that looks no faster than the best so far is timed again, and the best with it,
    before the search decides (each keeps its fastest time): a single probe on a shared CPU
    can be slowed by a neighbour, and one slow reading would stop the doubling early."""
    secs: dict[int, float] = {}

    def measure(size: int) -> None:
        secs[size] = min(secs.get(size, float("inf")), run(size))

    size, best = 1, 1
    while size <= cap:
        measure(size)
        if size != best and secs[size] >= secs[best]:
            measure(best)
            measure(size)
        if secs[size] < secs[best]:
            best = size
        elif secs[size] > secs[best] / 0.9:  # clearly slower (under 90% of the best tokens/s): stop doubling
            break
        if size == cap:
            break
        size = min(size * 2, cap)
    return best, {s: round(1.0 / t, 2) for s, t in secs.items()}


class AutoBatch:
    """The runtime's cache of automatic batch sizes."""

    def __init__(self) -> None:
        self._sizes: dict[tuple, tuple[int, dict[str, Any]]] = {}

    def size(self, key: tuple, probe: Callable[[], tuple[int, dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
        """The cached size for `key`, or the probe's answer (cached)."""
        if key in self._sizes:
            size, info = self._sizes[key]
            return size, {**info, "cached": True}
        start = time.perf_counter()
        size, info = probe()
        info = {**info, "probe_s": round(time.perf_counter() - start, 3), "cached": False}
        self._sizes[key] = (size, info)
        log.info("batch.auto", key=str(key), batch_size=size, how=info.get("how"))
        return size, info


def _cpu_probe(lm: LoadedModel, plan: Plan, job: JobSpec, order: list[int]):
    """Seconds per generated token at a given size, from a short batch of the longest prompts.

    The probe runs a few steps; its prefill and per-step decode times are extrapolated to
    the job's max_new_tokens (a real batch pays one prefill over many steps, so timing the
    short run as it is would favour small batches, whose prefill is cheaper).
    """
    max_new = job.generation.max_new_tokens
    steps = min(CPU_PROBE_STEPS, max_new)
    short = plan.shortened(steps, steps)

    def run(size: int) -> float:
        prompts = [job.prompts[i] for i in order[:size]]
        rows = size * plan.samples  # a prompt's samples are rows of their own, each with a seed
        timings = [gen.generate_batch(lm, short, prompts, [0] * rows).timing for _ in range(2)]
        prefill = min(t.prefill_s for t in timings)
        per_step = min(t.decode_s for t in timings) / max(steps - 1, 1)
        return (prefill + per_step * (max_new - 1)) / (rows * max_new)

    return run


def probe_length(plan: Plan, longest: int, max_new: int, every: int) -> int:
    """The sequence length the CUDA probe fits: the longest prompt's bucket plus the new tokens, or
    for a continuous-refill stream the columns of its KV buffers (decode.stream_span; `every`: steps
    between the loop's checks)."""
    bucket = length_bucket(longest)
    return stream_span(bucket, max_new, every) if plan.refill else bucket + max_new


def loop_peak(plan: Plan, longest: int) -> LoopPeak | None:
    """What the CUDA probe runs in the decode loop's preallocated KV buffers (a prefill of the longest
    prompt's bucket; for a stream, an admission's too), or None where the job runs in generate() or over
    transformers' own cache: there the probe is one forward pass of the whole length."""
    if plan.path is not Path.DECODE or plan.cache is not Cache.PREALLOCATED:
        return None
    return LoopPeak(length_bucket(longest), stream=plan.refill)


def auto_batch_size(runtime, lm: LoadedModel, plan: Plan, job: JobSpec, lengths: list[int]) -> tuple[int, dict]:
    """`batch_size: auto`: the probed size for this model, device and lengths (cached in the runtime).

    `lengths`: the job's prompts' token lengths; on CUDA, whose probe reads only the longest and how
    many there are, those of any part of the job (auto_groups asks per length bucket)."""
    cap = max(1, min(len(lengths), runtime.settings.auto_batch_max))
    longest = max(lengths)
    rows_each = plan.rows_each
    max_new = job.generation.max_new_tokens
    key = (
        runtime.cache.key(job.model, runtime.device),
        length_bucket(longest),
        max_new,
        rows_each,
        cap,
        plan.refill,
    )

    def probe() -> tuple[int, dict[str, Any]]:
        if runtime.device.type == "cuda":
            length = probe_length(plan, longest, max_new, gen.check_every(runtime.device))
            peak = loop_peak(plan, longest)
            size, probed = cuda_fit(plan.call(lm.model), runtime.device, length, rows_each, cap, peak)
            if peak is None:
                how = "largest batch whose forward pass of prompt + new tokens fits"
            else:
                admission = ", an admission's prefill" if peak.stream else ""
                how = (
                    f"{HEADROOM:.0%} of the largest batch that fits its KV buffers of {length} columns,"
                    f" a prefill of {peak.prompt} tokens{admission}, a decode step and the sampling tensors"
                )
            how += " (a stream's KV buffers)" if plan.refill else ""
            return size, {"how": how, "fits": probed}
        order = longest_first(lengths)  # indices into job.prompts: the CPU probe times them
        size, rates = cpu_fastest(_cpu_probe(lm, plan, job, order), cap)
        return size, {"how": "fastest tokens/s in a short probe of the longest prompts", "tokens_per_s": rates}

    return runtime.batch_sizes.size(key, probe)


def auto_groups(runtime, lm: LoadedModel, plan: Plan, job: JobSpec, lengths: list[int]):
    """`batch_size: auto` for a job: its prompts' indices in groups with their sizes, longest first, and the
    record. On CUDA each length bucket is probed and may start a group (length_groups); on the
    CPU, where speed and not memory sets the size, one probe of the longest prompts sizes the job."""
    if runtime.device.type != "cuda":
        size, probe = auto_batch_size(runtime, lm, plan, job, lengths)
        return [(size, longest_first(lengths))], {"auto": probe, "used": size}
    probes: list[tuple[int, int, dict]] = []

    def size_for(rest: list[int]) -> int:
        size, probe = auto_batch_size(runtime, lm, plan, job, rest)
        probes.append((max(rest), size, probe))
        return size

    groups = length_groups(lengths, size_for)
    info: dict[str, Any] = {"auto": probes[0][2], "used": max(size for size, _ in groups)}
    if len(probes) > 1:
        info["buckets"] = [{"longest": n, "batch_size": size, "fits": p.get("fits")} for n, size, p in probes]
    if len(groups) > 1:
        info["groups"] = [
            {"batch_size": size, "prompts": len(ix), "longest": max(lengths[i] for i in ix)} for size, ix in groups
        ]
    return groups, info
