"""A KV cache that is written in place: one allocation per batch instead of one per token.

transformers' `DynamicLayer` grows each layer's keys and values by `torch.cat` at every
step: every token copies the whole cache of every layer into a fresh allocation, which is
quadratic in the length and, on CPU, the largest single cost of a decode step for small
models (measured in docs/performance.md). `PreallocatedLayer` allocates the batch's final
length once (prompt + max_new_tokens) and writes each step's keys and values into it;
attention reads a view of the filled part, so the values are the same tensors the
dynamic layer would hold and greedy outputs are unchanged token for token.

`preallocated_cache(model, length)` returns a `DynamicCache` with such layers where the
model's layers are plain full-attention layers, and None otherwise (sliding-window,
linear-attention or hybrid layers keep transformers' own cache). `reorderable(model)` says
whether transformers' own cache is plain attention layers (full or sliding window), which
the beam loop needs. `keep_candidate` keeps one of the k candidate columns contrastive search
appends to each row.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class PreallocatedLayer(DynamicLayer):
    """A full-attention layer's keys and values in buffers of the batch's final length."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        batch, heads, _, dim = key_states.shape
        self._k = key_states.new_empty(batch, heads, self.capacity, dim)
        self._v = value_states.new_empty(batch, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        """Past the planned length (a caller that runs longer): double, as a list would."""
        self.capacity = max(needed, 2 * self.capacity)
        k, v = self._k, self._v
        self._k = k.new_empty(*k.shape[:2], self.capacity, k.shape[-1])
        self._v = v.new_empty(*v.shape[:2], self.capacity, v.shape[-1])
        self._k[:, :, : self.length] = k[:, :, : self.length]
        self._v[:, :, : self.length] = v[:, :, : self.length]

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if self.is_initialized and tokens_to_remove:
            self.length = max(self.length + tokens_to_remove, 0)
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        super().reset()


def trim_front(cache: DynamicCache, n: int) -> bool:
    """Drop the first `n` columns of every layer (columns no live row attends to): views, no copy.

    Only a preallocated cache's columns are the token ids' columns (a sliding-window layer,
    say, holds the last window): any other cache is left whole, and False says so."""
    if not all(isinstance(layer, PreallocatedLayer) for layer in cache.layers):
        return False
    for layer in cache.layers:
        layer._k, layer._v = layer._k[:, :, n:], layer._v[:, :, n:]
        layer.length, layer.capacity = layer.length - n, layer.capacity - n
        layer._views()
    return True


def splice(cache: DynamicCache, other: DynamicCache, parts, capacity: int) -> None:
    """Append `other`'s rows to `cache`'s, each side's columns from `start` placed at `dest`.

    `parts` is ((start, dest), (start, dest)) for `cache` and `other`; both sides must then
    end at the same column. Columns before a side's `dest` are zeros that its attention mask
    hides (zeros, not garbage: a masked NaN would still poison the weighted sum).
    """
    for mine, theirs in zip(cache.layers, other.layers):
        k, v = mine._k, mine._v
        rows = k.shape[0] + theirs._k.shape[0]
        new_k = k.new_zeros(rows, k.shape[1], capacity, k.shape[-1])
        new_v = v.new_zeros(rows, v.shape[1], capacity, v.shape[-1])
        lo, end = 0, None
        for layer, (start, dest) in zip((mine, theirs), parts):
            hi = lo + layer._k.shape[0]
            n = layer.length - start
            new_k[lo:hi, :, dest : dest + n] = layer._k[:, :, start : layer.length]
            new_v[lo:hi, :, dest : dest + n] = layer._v[:, :, start : layer.length]
            end, lo = dest + n, hi
        mine._k, mine._v, mine.length, mine.capacity = new_k, new_v, end, capacity
        mine._views()


def keep_candidate(cache: DynamicCache, best: torch.Tensor, k: int) -> None:
    """The last k columns of every layer are k candidates per row: keep row i's candidate best[i] as the
    row's next column and drop the rest (contrastive search's shared-cache step)."""
    rows = torch.arange(best.shape[0], device=best.device)
    for layer in cache.layers:
        start = layer.length - k
        layer._k[:, :, start] = layer._k[rows, :, start + best]
        layer._v[:, :, start] = layer._v[rows, :, start + best]
        layer.length = start + 1
        layer._views()


def _default_cache(model) -> DynamicCache | None:
    """transformers' default cache for the model's config (its layers say what kind each layer is), or
    None where that cache cannot read the config."""
    try:
        return DynamicCache(config=model.config)
    except Exception:  # a config transformers' cache cannot read: keep its default
        return None


def preallocated_cache(model, length: int) -> DynamicCache | None:
    """A cache of `PreallocatedLayer`s for `length` positions, or None where the model's layers are not plain."""
    cache = _default_cache(model)
    if cache is None or not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [PreallocatedLayer(length) for _ in cache.layers]
    return cache


def reorderable(model) -> bool:
    """Whether transformers' default cache for the model is plain attention layers (full or sliding
    window), whose rows the beam loop repeats, reorders and selects as generate() does."""
    supported = getattr(type(model), "_supports_default_dynamic_cache", None)
    if supported is not None and not supported():
        return False
    cache = _default_cache(model)
    plain = (DynamicLayer, DynamicSlidingWindowLayer)
    return cache is not None and bool(cache.layers) and all(type(layer) in plain for layer in cache.layers)
