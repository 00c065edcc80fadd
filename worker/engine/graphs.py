"""The decode step at the GPU's pace: a static, bucketed forward over the preallocated cache, captured as
CUDA graphs.

Eager PyTorch launches a few hundred kernels for each token of a small model, with Python around each:
at batch 1 the GPU waits for the host (docs/performance.md, "Measured on an H200"). vLLM captures its
decode step as CUDA graphs for a set of batch sizes; gpt-fast and transformers' static cache compile
it with `torch.compile(mode="reduce-overhead")`. `StaticStep` does the former for the model call's
decode forward (worker.engine.call) over the engine's own preallocated cache (worker.engine.kvcache);
the token choice (penalties, warpers, the seeded sampler, worker.engine.choose) stays eager.

The step's shapes and addresses do not change while a decode call runs:
- its rows are padded to a **bucket** (1, 2, 4, then multiples of 8, and the buffers' rows: vLLM's
  capture sizes), so compaction and refill move the live rows from bucket to bucket, a graph each;
- it attends over every column of the buffers with a prepared boolean mask (a live row's columns
  [lo, hi] as its attention mask says, a padding row only the step's own column) instead of the
  window's view;
- it writes its keys and values at the column a device tensor holds (`index_copy_` at the layers'
  `fixed`), so that a replay writes where the window ends now;
- nothing in it synchronises with the host or branches on a tensor's value.
Before each step a bucket's fixed inputs (ids, positions, mask, column) are written (a few copies, no
synchronisation); after it, every layer's window takes the written column.

Two ways to run it: eagerly (`graphs=False`: on the CPU, where there is no launch overhead to remove,
and `decode_step: static` anywhere; so its correctness is tested in every `make test`), or captured
(`graphs=True`, CUDA): a bucket's first step runs eagerly; its second runs eagerly on a side stream (the
warm-up a capture needs) and is captured into the call's one graph pool; the bucket's later steps replay
it. A bucket whose
capture fails (an operation that synchronises, say) stays eager, and the stats say why. Buffers that
grew (a write past the planned capacity) drop every graph, their addresses having changed; a step
whose window is not the rows' (which the loop never makes) runs the eager forward. A capture is no step's
work: the decode call's clock is paused while it runs (worker.engine.timing), so the step times and a
batch's total are the steady state's, and `capture_s` says what the captures cost. `StepStats` counts all
of it for result.json.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from worker.engine.kvcache import PreallocatedLayer, room

# a bucket is captured at its second step (its first runs eagerly): the buckets a stream passes through for a
# step as its last rows finish cost no capture
CAPTURE_AT = 2


class DecodeStep(str, Enum):
    """How the decode loop's model call steps (worker.engine.call; the plan chooses: plan.decode_step_of)."""

    EAGER = "eager"  # a forward over each layer's window of the preallocated cache (or transformers' own)
    STATIC = "static"  # the bucketed static step over the whole preallocated buffers, run eagerly
    GRAPHS = "graphs"  # the static step captured as CUDA graphs, one per bucket, replayed


def bucket_sizes(rows: int) -> tuple[int, ...]:
    """The buckets of buffers with `rows` rows: 1, 2, 4, the multiples of 8 below `rows`, and `rows`."""
    return tuple([b for b in (1, 2, 4) if b < rows] + list(range(8, rows, 8)) + [rows])


def bucket(n: int, rows: int) -> int:
    """The smallest bucket of buffers with `rows` rows that holds `n` live rows."""
    if n > rows:
        raise ValueError(f"{n} live rows in buffers of {rows}")
    small = next((b for b in (1, 2, 4) if n <= b), -(-n // 8) * 8)
    return min(small, rows)


@dataclass
class StepStats:
    """What the static steps of a decode call (or a job's, `add`ed) did, for result.json's engine record."""

    steps: int = 0  # static steps (replayed or run eagerly)
    replays: int = 0  # of them, graph replays
    captured: int = 0  # graphs captured (one per bucket used, again after the buffers grew)
    buckets: set[int] = field(default_factory=set)  # the buckets the live rows used
    failed: dict[int, str] = field(default_factory=dict)  # bucket -> why its capture failed (it ran eagerly)
    eager: int = 0  # steps that ran the eager forward instead (no column left, a window out of step)
    recaptures: int = 0  # times grown buffers dropped the graphs
    pool_bytes: int = 0  # device memory the captures reserved (the graphs' pool), summed over decode calls
    capture_s: float = 0.0  # host seconds the captures took (left out of the step times: StepClock.paused)

    def add(self, other: StepStats) -> None:
        self.steps += other.steps
        self.replays += other.replays
        self.captured += other.captured
        self.buckets |= other.buckets
        self.failed.update(other.failed)
        self.eager += other.eager
        self.recaptures += other.recaptures
        self.pool_bytes = max(self.pool_bytes, other.pool_bytes)  # calls run one after another: the largest
        self.capture_s += other.capture_s

    @classmethod
    def parse(cls, record: dict[str, Any]) -> StepStats:
        """The stats a batch's `record` wrote (result.json's batches), to `add` a job's up."""
        return cls(
            record["static_steps"],
            record["graph_replays"],
            record["graphs_captured"],
            set(record["buckets"]),
            {int(b): why for b, why in record["capture_failed"].items()},
            record["eager_steps"],
            record["recaptures"],
            int(record["graph_pool_mib"] * 2**20),
            record["capture_s"],
        )

    def record(self) -> dict[str, Any]:
        return {
            "static_steps": self.steps,
            "graph_replays": self.replays,
            "graphs_captured": self.captured,
            "buckets": sorted(self.buckets),
            "capture_failed": {str(b): why for b, why in sorted(self.failed.items())},
            "eager_steps": self.eager,
            "recaptures": self.recaptures,
            "graph_pool_mib": round(self.pool_bytes / 2**20, 1),
            "capture_s": round(self.capture_s, 4),
        }


@dataclass
class _Bucket:
    """A bucket's fixed inputs (b rows of q tokens), and its graph and outputs once captured."""

    ids: torch.Tensor  # (b, q)
    pos: torch.Tensor  # (b, q)
    mask: torch.Tensor  # (b, 1, q, columns) bool
    columns: torch.Tensor  # (q,) the cache columns the step writes
    hidden: bool  # the step also returns the last layer's hidden states (contrastive search's candidates)
    own: torch.Tensor  # (q, q) bool: each token attends to its own column
    offsets: torch.Tensor  # (q,) 0 .. q-1: the columns from the window's end
    uses: int = 0  # steps the bucket has run
    replay: Callable[[], None] | None = None  # the captured graph's replay
    outputs: tuple[torch.Tensor, ...] = ()  # the graph's outputs, rewritten by each replay


@dataclass
class Output:
    """A static step's output, as the chooser reads a model output: the live rows' logits (n, 1, vocabulary)."""

    logits: torch.Tensor


class StaticStep:
    """The static step of one decode call over one preallocated cache (`graphs`: captured as CUDA graphs).

    It holds no reference to the cache, which each call passes (the model call keeps it by a weak key): a
    cache that goes, the batch-size probe's say, takes its static step and graphs with it."""

    def __init__(self, model, keyword: str, *, graphs: bool, pause=nullcontext) -> None:
        """`pause()`: a context its captures run in (the decode call's clock, paused: `StepClock.paused`)."""
        self.model, self.keyword, self.graphs, self._pause = model, keyword, graphs, pause
        self.stats = StepStats()
        self._buckets: dict[tuple[int, int], _Bucket] = {}  # (rows, tokens a row) -> its inputs and graph
        self._buffers: tuple[int, int, int] | None = None  # (address, columns, rows) the buckets were made for
        self._capture = CudaCapture() if graphs else None

    def __call__(self, rows, cache, eager):
        """The rows' step, one token a row: (output, cache), as `ModelCall.forward` answers; `eager`: the model
        call's eager forward, for a step the static one cannot take (its mask covers the new column)."""
        if not self._fits(cache, 1, rows.width - 1):
            self.stats.eager += 1
            return eager(rows, cache)
        (logits,) = self._step(cache, rows.ids[:, -1:], rows.pos, rows.attn, hidden=False)
        return Output(logits), cache

    def candidates(self, cache, attn, top_ids, eager):
        """Contrastive search's pass (`ModelCall.candidates`): every live row's k candidates as k tokens of the
        row at its next position, each attending to the row's past (`attn`, the cache's window) and to itself:
        (logits (n, k, V), last hidden states (n, k, D)); `eager`, where the static step cannot take it."""
        if not self._fits(cache, top_ids.shape[1], attn.shape[1]):
            self.stats.eager += 1
            return eager()
        return self._step(cache, top_ids, attn.sum(-1, keepdim=True), attn, hidden=True)

    def _fits(self, cache, q: int, past: int) -> bool:
        """Whether the step can write its q columns (a stream's window slides to the front first, which the loop's
        checks do before) and the rows' mask is the window's (`past` columns of it)."""
        first = cache.layers[0]
        if not first.is_initialized:
            return False
        if first.hi + q > first.capacity:
            room(cache, q)
        return first.hi + q <= first.capacity and past == first.length

    def _step(self, cache, ids, pos, attn, *, hidden: bool) -> tuple[torch.Tensor, ...]:
        """The bucket's inputs written from the live rows', the step run (replayed), the windows moved on: the
        outputs' live rows."""
        first = cache.layers[0]
        self._same_buffers(first)
        n, q = ids.shape
        b = bucket(n, first._k.shape[0])
        entry = self._buckets.get((b, q)) or self._bucket(b, q, first, hidden)
        lo, hi = first.lo, first.hi
        entry.ids[:n].copy_(ids)
        entry.pos[:n].copy_(pos)
        entry.mask.zero_()
        entry.mask[:n, 0, :, lo : lo + attn.shape[1]] = attn[:, None, :].bool()
        # each token its own column (for one token a row, the column the rows' mask ends with); a padding row
        # attends to nothing else (no empty softmax)
        entry.mask[:, 0, :, hi : hi + q] |= entry.own
        torch.add(entry.offsets, hi, out=entry.columns)
        outputs = self._graphed(cache, entry, (b, q)) if self.graphs else self._forward(cache, entry)
        for layer in cache.layers:
            layer.stepped(q)
        self.stats.steps += 1
        self.stats.buckets.add(b)
        return tuple(out[:n] for out in outputs)

    def _same_buffers(self, first: PreallocatedLayer) -> None:
        """Drop the buckets (and their graphs) where the buffers are not those they were made for."""
        now = (first._k.data_ptr(), first._k.shape[2], first._k.shape[0])
        if now != self._buffers:
            if any(entry.replay is not None for entry in self._buckets.values()):
                self.stats.recaptures += 1
            self._buckets.clear()
            self._buffers = now

    def _bucket(self, b: int, q: int, first: PreallocatedLayer, hidden: bool) -> _Bucket:
        device, columns = first._k.device, first._k.shape[2]
        entry = _Bucket(
            ids=torch.zeros(b, q, dtype=torch.long, device=device),
            pos=torch.zeros(b, q, dtype=torch.long, device=device),
            mask=torch.zeros(b, 1, q, columns, dtype=torch.bool, device=device),
            columns=torch.zeros(q, dtype=torch.long, device=device),
            hidden=hidden,
            own=torch.eye(q, dtype=torch.bool, device=device),
            offsets=torch.arange(q, device=device),
        )
        self._buckets[(b, q)] = entry
        return entry

    def _forward(self, cache, entry: _Bucket) -> tuple[torch.Tensor, ...]:
        """The model over the bucket's inputs, its layers writing at the columns tensor: the logits (b, q, V), and
        the last hidden states (b, q, D) where the bucket asks for them."""
        for layer in cache.layers:
            layer.fixed = entry.columns
        try:
            more = {"output_hidden_states": True} if entry.hidden else {}
            out = self.model(
                input_ids=entry.ids,
                attention_mask=entry.mask,
                position_ids=entry.pos,
                use_cache=True,
                **{self.keyword: cache},
                **more,
            )
        finally:
            for layer in cache.layers:
                layer.fixed = None
        return (out.logits, out.hidden_states[-1]) if entry.hidden else (out.logits,)

    def _graphed(self, cache, entry: _Bucket, key: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        """Replay the bucket's graph; its first step runs eagerly, its second is the capture's warm-up and capture."""
        if entry.replay is not None:
            entry.replay()
            self.stats.replays += 1
            return entry.outputs
        entry.uses += 1
        if entry.uses < CAPTURE_AT or key[0] in self.stats.failed:
            return self._forward(cache, entry)
        outputs = self._capture.warm(lambda: self._forward(cache, entry))  # this step's own result
        started = time.perf_counter()
        try:
            with self._pause():  # the capture is no step's work: left out of the step times, recorded apart
                entry.replay, entry.outputs, used = self._capture.capture(lambda: self._forward(cache, entry))
        except torch.cuda.OutOfMemoryError:
            raise  # the OOM retry's (and the batch-size probe's) to handle
        except RuntimeError as exc:  # an operation a capture refuses: this bucket stays eager
            self.stats.failed[key[0]] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return outputs
        finally:
            self.stats.capture_s += time.perf_counter() - started
        self.stats.captured += 1
        self.stats.pool_bytes += used
        return outputs


class CudaCapture:
    """torch.cuda's graphs for one decode call: its captures share one memory pool."""

    def __init__(self) -> None:
        self.pool = None

    def warm(self, run: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """`run` eagerly on a side stream, as a capture's warm-up must (lazy initialisations, cuBLAS workspaces)."""
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            outputs = run()
        main.wait_stream(side)
        for out in outputs:
            out.record_stream(main)
        return outputs

    def capture(
        self, run: Callable[[], tuple[torch.Tensor, ...]]
    ) -> tuple[Callable[[], None], tuple[torch.Tensor, ...], int]:
        """`run` captured (not run): its replay, its outputs (rewritten by each replay), the bytes it reserved."""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # as the capture's context does first: the difference is then the pool's alone
        reserved = torch.cuda.memory_reserved()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the job's finisher thread (detokenising the last batch) may touch CUDA meanwhile
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            outputs = run()
        self.pool = self.pool or graph.pool()
        return graph.replay, outputs, max(torch.cuda.memory_reserved() - reserved, 0)
