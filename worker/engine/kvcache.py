"""A KV cache that is written in place: one allocation per batch instead of one per token.

transformers' `DynamicLayer` grows each layer's keys and values by `torch.cat` at every
step: every token copies the whole cache of every layer into a fresh allocation, which is
quadratic in the length and, on CPU, the largest single cost of a decode step for small
models (measured in docs/performance.md). `PreallocatedLayer` allocates the batch's final
length once (prompt + max_new_tokens) and writes each step's keys and values into it;
attention reads a view of the filled part, so the values are the same tensors the
dynamic layer would hold and greedy outputs are unchanged token for token.

Everything else the decode loop does to the cache also happens inside those buffers: compaction
(`batch_select_indices`), dropping leading columns no row attends to (`trim_front`), a
continuous-refill stream's newcomers (`append_rows`) and the slide of the window of columns
back to the buffers' front that reclaims the columns finished rows freed (`room`). A stream
allocates its buffers once, for its slots and `decode.stream_span` columns.

`preallocated_cache(model, length, rows)` returns a `DynamicCache` with such layers where the
model's layers are plain full-attention layers, and None otherwise (sliding-window,
linear-attention or hybrid layers keep transformers' own cache). `reorderable(model)` says
whether transformers' own cache is plain attention layers (full or sliding window), which the
steps that reorder or repeat rows need. `keep_candidate` keeps one of the k candidate columns
contrastive search appends to each row.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class PreallocatedLayer(DynamicLayer):
    """A full-attention layer's keys and values in buffers allocated once: (rows, heads, capacity, dim).

    The layer's keys and values are the view of its `n` live rows and the columns [lo, hi) of
    the buffers. Every change a decoding loop makes happens inside the buffers, so a batch
    allocates its cache once: a step writes column `hi`; compaction moves the kept rows to the
    front (`batch_select_indices`); dropping leading columns no row attends to moves `lo`
    (`trim_front`); `append_rows` writes a continuous-refill stream's newcomers into free rows;
    `move` slides the window of columns (a stream reclaims the columns its finished rows freed).
    Only a caller that writes past the planned capacity makes the layer grow (it first slides
    the window to the front where that makes room). Every temporary copy holds one layer's
    live part, never a second cache.
    """

    def __init__(self, capacity: int, rows: int | None = None) -> None:
        super().__init__()
        self.capacity = capacity  # columns of the buffers
        self.rows = rows  # rows of the buffers (a stream's slots); default: the first write's batch
        self.n = self.lo = self.hi = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        # the static step's columns (worker.engine.graphs): a (q,) device tensor while it runs, else None
        self.fixed: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.hi - self.lo

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        batch, heads, _, dim = key_states.shape
        rows = max(self.rows or 0, batch)
        # zeros, not garbage: columns a row does not attend to are masked, and a masked NaN would
        # still poison attention's weighted sum
        self._k = key_states.new_zeros(rows, heads, self.capacity, dim)
        self._v = value_states.new_zeros(rows, heads, self.capacity, value_states.shape[-1])
        self.n = batch
        self.is_initialized = True

    def _resize(self, rows: int, columns: int) -> None:
        """New buffers of at least rows x columns (doubling, as a list would), the live part at column 0."""
        rows, columns = max(rows, self._k.shape[0]), max(columns, 2 * self.capacity)
        k, v = self._k, self._v
        self._k = k.new_zeros(rows, k.shape[1], columns, k.shape[-1])
        self._v = v.new_zeros(rows, v.shape[1], columns, v.shape[-1])
        self._k[: self.n, :, : self.length] = k[: self.n, :, self.lo : self.hi]
        self._v[: self.n, :, : self.length] = v[: self.n, :, self.lo : self.hi]
        self.lo, self.hi, self.capacity = 0, self.length, columns

    def move(self, lo: int) -> None:
        """Slide the window of columns to start at `lo` (through a copy of the live part)."""
        if lo == self.lo or not self.is_initialized:
            return
        if lo + self.length > self.capacity:
            self._resize(self.n, lo + self.length)
        end = lo + self.length
        for buf in (self._k, self._v):
            part = buf[: self.n, :, self.lo : self.hi].clone()
            buf[: self.n, :, lo:end] = part
        self.lo, self.hi = lo, end
        self._views()

    def _views(self) -> None:
        self.keys = self._k[: self.n, :, self.lo : self.hi]
        self.values = self._v[: self.n, :, self.lo : self.hi]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.fixed is not None:  # the static step: shapes and addresses that never change
            return self._fixed_update(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.hi + key_states.shape[-2]
        if end > self.capacity:  # past the planned length: to the front if that makes room, else grow
            if self.lo and self.length + key_states.shape[-2] <= self.capacity:
                self.move(0)
            else:
                self._resize(self.n, self.length + key_states.shape[-2])
            end = self.hi + key_states.shape[-2]
        self._k[: self.n, :, self.hi : end] = key_states
        self._v[: self.n, :, self.hi : end] = value_states
        self.hi = end
        self._views()
        return self.keys, self.values

    def _fixed_update(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """The static step's write: the step's columns of the bucket's b rows at the columns `fixed` holds
        (a device tensor, so a captured graph replays it at any column), through `index_copy_` into the
        buffers; the buffers' first b rows returned whole (every column: the step's mask says which a row
        attends to). `lo`, `hi` and the views move after the step (`graphs.StaticStep`), not here, where a
        replayed graph would not run Python."""
        b = key_states.shape[0]
        self._k[:b].index_copy_(2, self.fixed, key_states)
        self._v[:b].index_copy_(2, self.fixed, value_states)
        return self._k[:b], self._v[:b]

    def stepped(self, q: int = 1) -> None:
        """The static step wrote the q columns from `hi`: the window takes them."""
        self.hi += q
        self._views()

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows at `indices`, in that order, as rows 0..len-1 of the same buffers."""
        if not self.is_initialized:
            return
        m = indices.shape[0]
        if m > self._k.shape[0]:
            self._resize(m, self.capacity)
        indices = indices.to(self.device)
        for buf in (self._k, self._v):
            part = buf[:, :, self.lo : self.hi].index_select(0, indices)  # a copy of the kept rows' live part
            buf[:m, :, self.lo : self.hi] = part
        self.n = m
        self._views()

    def append_rows(self, other: PreallocatedLayer) -> None:
        """Write `other`'s rows after the live ones, their columns ending at `hi` (which must leave
        room for them: `other.length <= hi`); the window widens to the left where they need it."""
        k = other.n
        if self.n + k > self._k.shape[0]:
            self._resize(self.n + k, self.capacity)
        start = self.hi - other.length
        for buf, theirs in ((self._k, other._k), (self._v, other._v)):
            buf[self.n : self.n + k, :, start : self.hi] = theirs[:k, :, other.lo : other.hi]
        self.n += k
        self.lo = min(self.lo, start)
        self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if self.is_initialized and tokens_to_remove:
            self.hi = max(self.hi + tokens_to_remove, self.lo)
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k = self._k[: self.n].repeat_interleave(repeats, dim=0)
            self._v = self._v[: self.n].repeat_interleave(repeats, dim=0)
            self.n *= repeats
            self._views()

    def reset(self) -> None:
        self._k = self._v = None
        self.n = self.lo = self.hi = 0
        super().reset()


def _layers(cache: DynamicCache) -> list[PreallocatedLayer] | None:
    """The cache's layers where every one is a PreallocatedLayer (whose columns are the token ids'
    columns: a sliding-window layer, say, holds the last window), else None."""
    layers = list(cache.layers)
    return layers if all(isinstance(layer, PreallocatedLayer) for layer in layers) else None


def is_preallocated(cache: DynamicCache) -> bool:
    """Whether every layer of the cache is a PreallocatedLayer (the static step's buffers)."""
    return _layers(cache) is not None


def trim_front(cache: DynamicCache, n: int) -> bool:
    """Drop the first `n` columns of every layer (columns no live row attends to): no copy.

    Any cache but a preallocated one is left whole, and False says so."""
    layers = _layers(cache)
    if layers is None:
        return False
    for layer in layers:
        layer.lo = min(layer.lo + n, layer.hi)
        layer._views()
    return True


def room(cache: DynamicCache, steps: int) -> bool:
    """Make room for `steps` more columns without growing, sliding the window to the front if its
    end is that near the buffers' (a stream's finished rows free its leading columns): True if it
    moved (one copy of the live cache)."""
    layers = _layers(cache)
    if layers is None or not layers[0].is_initialized or layers[0].hi + steps <= layers[0].capacity:
        return False
    for layer in layers:
        layer.move(0)
    return True


def append_rows(cache: DynamicCache, other: DynamicCache) -> None:
    """Append `other`'s rows (newcomers' prefilled prompts) to `cache`'s buffers, their columns ending
    where the live rows' end, sliding the window right first where the live rows' columns are fewer
    than the newcomers'. The columns before each row's own are masked for it."""
    for mine, theirs in zip(cache.layers, other.layers):
        if mine.hi < theirs.length:
            mine.move(mine.lo + theirs.length - mine.hi)
        mine.append_rows(theirs)


def keep_candidate(cache: DynamicCache, best: torch.Tensor, k: int) -> None:
    """The last k columns of every layer are k candidates per row: keep row i's candidate best[i] as the
    row's next column and drop the rest (contrastive search's shared-cache step)."""
    rows = torch.arange(best.shape[0], device=best.device)
    for layer in cache.layers:
        start = layer.hi - k
        layer._k[rows, :, start] = layer._k[rows, :, start + best]
        layer._v[rows, :, start] = layer._v[rows, :, start + best]
        layer.hi = start + 1
        layer._views()


def _default_cache(model) -> DynamicCache | None:
    """transformers' default cache for the model's config (its layers say what kind each layer is), or
    None where that cache cannot read the config."""
    try:
        return DynamicCache(config=model.config)
    except Exception:  # a config transformers' cache cannot read: keep its default
        return None


def preallocated_cache(model, length: int, rows: int | None = None) -> DynamicCache | None:
    """A cache of `PreallocatedLayer`s for `length` positions (and `rows` rows: a stream's slots), or
    None where the model's layers are not plain."""
    cache = _default_cache(model)
    if cache is None or not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [PreallocatedLayer(length, rows) for _ in cache.layers]
    return cache


def reorderable(model) -> bool:
    """Whether transformers' default cache for the model is plain attention layers (full or sliding
    window), whose rows beam search's step repeats, reorders and selects as generate() does."""
    supported = getattr(type(model), "_supports_default_dynamic_cache", None)
    if supported is not None and not supported():
        return False
    cache = _default_cache(model)
    plain = (DynamicLayer, DynamicSlidingWindowLayer)
    return cache is not None and bool(cache.layers) and all(type(layer) in plain for layer in cache.layers)
