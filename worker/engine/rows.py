"""The live rows of the engine's decoding loop: token ids, attention mask, positions, per-row steps.

`Rows` holds a batch's token ids and attention mask in buffers of their final width, grown
by writing a column (never by concatenation), with `ids` and `attn` views of the filled part.
Every row counts its own steps, so rows that joined at different times (continuous refill)
share one loop: `advance` appends a step's tokens and marks the rows that end (EOS, a stop
string, or `max_new_tokens` reached), `keep` drops finished rows (compaction) from the
buffers and the KV cache, and `merge` appends newly prefilled rows, right-aligned to the
batch's columns, dropping the columns no live row attends to any more.

Row indices (`live`) are positions in the job's queue of prompts, so `n_new`, `at_eos` (one
record per queue, shared by the Rows drawn from it) and the output tokens are indexed the same
way however rows come and go.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from worker.engine.kvcache import append_rows, trim_front

_SERIAL = itertools.count()  # tells Rows objects apart (an id() may be reused once one is freed)


class Ends(NamedTuple):
    """What ends a row: its EOS ids, the pad that follows (None: the first EOS id) and max_new_tokens."""

    eos: list[int]
    pad: int | None
    max_new: int

    @property
    def fill(self) -> int:
        """The token written after a row's end."""
        return self.pad if self.pad is not None else (self.eos[0] if self.eos else 0)


class Rows:
    def __init__(self, input_ids, attn, ends: Ends, *, first=0, total=None, queue: Rows | None = None):
        """`first`: the queue index of the first row; `queue`: the Rows whose per-queue record
        (`n_new`, `at_eos`) these rows share, else a record of `total` rows (default: these)."""
        batch, width = input_ids.shape
        device = input_ids.device
        eos, max_new = ends.eos, ends.max_new
        self.pad = ends.fill
        self.max_new = max_new
        self._ids = input_ids.new_full((batch, width + max_new), self.pad)
        self._attn = attn.new_ones((batch, width + max_new))
        self._ids[:, :width], self._attn[:, :width] = input_ids, attn
        self.width = width
        self.pos = attn.sum(-1, keepdim=True) - 1  # the position of each row's last token
        self.live = torch.arange(first, first + batch, device=device)  # each live row's place in the queue
        self.steps = torch.zeros(batch, dtype=torch.long, device=device)  # tokens each row has been given
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=device)
        if queue is None:
            total = first + batch if total is None else total
            self.n_new = torch.full((total,), -1, dtype=torch.long, device=device)
            self.at_eos = torch.zeros(total, dtype=torch.bool, device=device)
        else:  # one record per queue, shared by every Rows drawn from it (never copied)
            self.n_new, self.at_eos = queue.n_new, queue.at_eos
        self.eos = torch.tensor(eos, dtype=torch.long, device=device)
        self.layout = (next(_SERIAL), 0)  # changes when rows leave or join, not when they are reordered
        self._ctx: torch.Tensor | None = None  # per column, a vector (contrastive search: the hidden states)
        self.carry: torch.Tensor | None = None  # per row, what a loop carries to its next step (logits)

    @property
    def ids(self) -> torch.Tensor:
        return self._ids[:, : self.width]

    @property
    def attn(self) -> torch.Tensor:
        return self._attn[:, : self.width]

    @property
    def context(self) -> torch.Tensor:
        return self._ctx[:, : self.width]

    def set_context(self, vectors: torch.Tensor) -> None:
        """A vector per column of the filled part (rows, width, dim), kept in a buffer as wide as the ids'."""
        self._ctx = vectors.new_zeros(vectors.shape[0], self._ids.shape[1], vectors.shape[-1])
        self._ctx[:, : self.width] = vectors

    def set_last_context(self, vectors: torch.Tensor) -> None:
        """The vector of each row's last column (rows, dim)."""
        self._ctx[:, self.width - 1] = vectors

    def _room(self, columns: int) -> None:
        """Buffers with at least `columns` columns (a stream's finished rows may step past their end)."""
        if columns > self._ids.shape[1]:
            grow = max(columns, 2 * self._ids.shape[1]) - self._ids.shape[1]
            self._ids = torch.cat([self._ids, self._ids.new_full((self._ids.shape[0], grow), self.pad)], 1)
            self._attn = torch.cat([self._attn, self._attn.new_ones((self._attn.shape[0], grow))], 1)
            if self._ctx is not None:
                more = self._ctx.new_zeros(self._ctx.shape[0], grow, self._ctx.shape[-1])
                self._ctx = torch.cat([self._ctx, more], 1)

    def advance(self, nxt, scores, stop) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's tokens (pad for finished rows); mark rows that end here.

        Returns the tokens and, per row, the output column to write them to (finished rows
        write to column max_new_tokens, a spare one, so a write never needs a host sync)."""
        was = self.unfinished
        nxt = torch.where(was, nxt, self.pad)
        self._room(self.width + 1)
        self._ids[:, self.width] = nxt
        self.width += 1
        self.pos += 1
        column = torch.where(was, self.steps, self.max_new)
        self.steps += was.long()
        is_eos = torch.isin(nxt, self.eos)
        ends = is_eos | stop(self.ids, scores, own=self.steps) if stop is not None else is_eos
        newly = ends & was
        self.n_new[self.live] = torch.where(newly, self.steps, self.n_new[self.live])
        self.at_eos[self.live] |= newly & is_eos
        self.unfinished = was & ~newly & (self.steps < self.max_new)
        return nxt, column

    def keep(self, index, cache, sampler) -> None:
        """Only the rows at `index` stay (compaction); leading columns none of them attends to go."""
        if index.numel():
            unused = int(self.attn[index].any(0).int().argmax())  # the first column a kept row attends to
            if unused and trim_front(cache, unused):
                self._ids, self._attn, self.width = self._ids[:, unused:], self._attn[:, unused:], self.width - unused
                self._ctx = self._ctx[:, unused:] if self._ctx is not None else None
        self.reorder(index, cache)
        self.layout = (self.layout[0], self.layout[1] + 1)
        if sampler is not None:
            sampler.rows = self.live

    def reorder(self, index, cache) -> None:
        """The rows at `index`, in that order (repeats allowed: beams copied from their parents), in the
        buffers and the KV cache; no host synchronisation."""
        self._ids, self._attn, self.pos = self._ids[index], self._attn[index], self.pos[index]
        self.live, self.unfinished, self.steps = self.live[index], self.unfinished[index], self.steps[index]
        self._ctx = self._ctx[index] if self._ctx is not None else None
        self.carry = self.carry[index] if self.carry is not None else None
        cache.batch_select_indices(index)

    def expand(self, n: int, cache) -> None:
        """Each row repeated `n` times in place, in the buffers and the KV cache (a prompt's samples after its
        one prefill): row at queue place q becomes the rows at places q*n .. q*n+n-1."""
        index = torch.arange(self.live.numel(), device=self.live.device).repeat_interleave(n)
        places = (self.live[:, None] * n + torch.arange(n, device=self.live.device)).reshape(-1)
        self.reorder(index, cache)
        self.live = places
        self.layout = (self.layout[0], self.layout[1] + 1)

    def append(self, nxt: torch.Tensor) -> None:
        """A column of tokens, one per row, for a loop that keeps its own record of ends (beam search)."""
        self._room(self.width + 1)
        self._ids[:, self.width] = nxt
        self.width += 1
        self.pos += 1
        self.steps += 1

    def merge(self, other: Rows, cache, other_cache, sampler) -> None:
        """Append `other`'s rows (prefilled, one token each), right-aligned; trim unattended columns.

        A row's columns keep their order and its positions are its own, so every row computes
        what it would in a batch of its own; the columns before the first one any row attends
        to are dropped, so the width stays within the longest prompt plus max_new_tokens. The
        newcomers' keys and values are written into the stream's own buffers (kvcache.append_rows).
        """
        width = max(self.width, other.width)
        offsets = (width - self.width, width - other.width)
        firsts = [int(r.attn.any(0).nonzero()[0]) if r.attn.shape[0] else r.width for r in (self, other)]
        start = min(f + o for f, o in zip(firsts, offsets))
        kept = width - start
        capacity = kept + self.max_new + 1
        rows = self.live.numel() + other.live.numel()
        ids = self._ids.new_full((rows, capacity), self.pad)
        attn = self._attn.new_ones((rows, capacity))
        ctx = None if other._ctx is None else other._ctx.new_zeros(rows, capacity, other._ctx.shape[-1])
        for r, off, lo in ((self, offsets[0], 0), (other, offsets[1], self.live.numel())):
            side_start = max(start - off, 0)  # the side's first column that stays
            dst = side_start + off - start
            hi = lo + r.live.numel()
            attn[lo:hi, :dst] = 0
            ids[lo:hi, dst : dst + r.width - side_start] = r.ids[:, side_start:]
            attn[lo:hi, dst : dst + r.width - side_start] = r.attn[:, side_start:]
            if ctx is not None and r.live.numel():
                ctx[lo:hi, dst : dst + r.width - side_start] = r.context[:, side_start:]
        append_rows(cache, other_cache)  # both sides' caches end at one column
        trim_front(cache, start)
        self._ids, self._attn, self._ctx, self.width = ids, attn, ctx, kept
        if other.carry is not None:
            self.carry = other.carry if self.carry is None else torch.cat([self.carry, other.carry])
        self.pos = torch.cat([self.pos, other.pos])
        self.live = torch.cat([self.live, other.live])
        self.steps = torch.cat([self.steps, other.steps])
        self.unfinished = torch.cat([self.unfinished, other.unfinished])
        self.layout = (self.layout[0], self.layout[1] + 1)
        if sampler is not None:
            sampler.rows = self.live
