"""The engine's preallocated KV cache and the overlap of a batch's host half with the next batch.

- `PreallocatedLayer` holds exactly the keys and values transformers' `DynamicLayer` would
  (prefill, decode steps, compaction, growth past its planned length), so every logit is
  the same; models whose layers are not plain full attention keep transformers' cache.
- The job finishes batch k (detokenising, cutting at stops) on a finisher thread while
  batch k+1 runs: shown by a finish that cannot complete until the next batch has started.
"""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import DynamicCache

from tests.support.engine import job, sliding_window_config
from tests.support.services import AUSTEN_PROMPTS as PROMPTS
from worker.core.contract import ModelSpec
from worker.core.logs import configure, job_context
from worker.engine import generate as engine
from worker.engine import plan as planning
from worker.engine.job import generate_job
from worker.engine.kvcache import PreallocatedLayer, preallocated_cache

pytestmark = pytest.mark.timeout(120)


def _steps(model, enc, cache, steps: int, keep_at: int | None = None):
    """Greedy steps over `cache`; at step `keep_at` keep rows 0 and 2. Logits of every step."""
    ids, attn = enc["input_ids"], enc["attention_mask"]
    logits = []
    with torch.inference_mode():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=True)
        for step in range(steps):
            logits.append(out.logits[:, -1])
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            ids, attn = torch.cat([ids, nxt], -1), torch.cat([attn, attn.new_ones(attn.shape[0], 1)], -1)
            if step == keep_at:
                index = torch.tensor([0, 2])
                ids, attn = ids[index], attn[index]
                out.cache.batch_select_indices(index)
            pos = attn.sum(-1, keepdim=True) - 1
            out = model(input_ids=ids[:, -1:], attention_mask=attn, position_ids=pos, cache=out.cache, use_cache=True)
    return logits


@pytest.mark.parametrize("capacity", [64, 9])  # 9: fewer than prompt + steps, so the buffers grow
def test_preallocated_cache_gives_the_logits_of_transformers_dynamic_cache(tiny_model, runtime, capacity):
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    enc = lm.tokenizer(PROMPTS[:3], return_tensors="pt", padding=True)
    ours = preallocated_cache(lm.model, capacity)
    assert ours is not None and all(isinstance(layer, PreallocatedLayer) for layer in ours.layers)
    theirs = _steps(lm.model, enc, DynamicCache(config=lm.model.config), 12, keep_at=5)
    mine = _steps(lm.model, enc, ours, 12, keep_at=5)
    for a, b in zip(theirs, mine):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert ours.get_seq_length() == enc["input_ids"].shape[1] + 12  # the prompt, then 12 decode steps
    assert ours.layers[0].capacity >= ours.get_seq_length()


def test_crop_reorder_repeat_and_reset_keep_the_layer_consistent():
    layer = PreallocatedLayer(8)
    k = torch.arange(2 * 1 * 5 * 2, dtype=torch.float32).reshape(2, 1, 5, 2)
    keys, _ = layer.update(k, k + 1)
    assert torch.equal(keys, k) and layer.get_seq_length() == 5
    layer.crop(-2)
    assert torch.equal(layer.keys, k[:, :, :3]) and layer.get_seq_length() == 3
    with pytest.raises(ValueError):
        layer.crop(1)
    layer.reorder_cache(torch.tensor([1, 0]))  # beam reordering and repetition keep buffer and views together
    assert torch.equal(layer.keys, k[[1, 0], :, :3]) and torch.equal(layer.values, k[[1, 0], :, :3] + 1)
    layer.batch_repeat_interleave(2)
    assert torch.equal(layer.keys, k[[1, 1, 0, 0], :, :3])
    keys, _ = layer.update(k[[0, 0, 1, 1], :, :1], k[[0, 0, 1, 1], :, :1])  # and the next write lands after them
    assert torch.equal(keys[:, :, 3], k[[0, 0, 1, 1], :, 0])
    layer.reset()
    assert layer.get_seq_length() == 0 and not layer.is_initialized


def test_compaction_newcomers_and_slides_stay_in_the_layers_buffers():
    """Rows dropped, newcomers appended, the window trimmed and slid: the same two buffers throughout,
    and every view holds the keys and values it would hold in a fresh layer."""
    layer = PreallocatedLayer(12, rows=4)
    k = torch.arange(3 * 1 * 5 * 2, dtype=torch.float32).reshape(3, 1, 5, 2)
    layer.update(k, -k)
    buffers = (layer._k.data_ptr(), layer._v.data_ptr())
    assert layer._k.shape == (4, 1, 12, 2) and not layer._k[3].any()  # zeros where no row has written
    layer.batch_select_indices(torch.tensor([2, 0]))  # compaction: rows 2 and 0, in place
    assert torch.equal(layer.keys, k[[2, 0]]) and torch.equal(layer.values, -k[[2, 0]])
    layer.lo += 2  # as kvcache.trim_front does: leading columns no row attends to
    layer._views()
    new = PreallocatedLayer(4)
    n = torch.full((2, 1, 4, 2), 100.0)
    new.update(n, -n)
    layer.append_rows(new)  # a stream's newcomers: 4 columns ending where the live rows' end
    assert layer.n == 4 and (layer.lo, layer.hi) == (1, 5)
    assert torch.equal(layer.keys[2:], n) and torch.equal(layer.keys[:2, :, 1:], k[[2, 0], :, 2:])
    step = torch.full((4, 1, 1, 2), 7.0)
    for _ in range(8):  # past the buffers' end: the window slides to the front instead of growing
        layer.update(step, -step)
    assert (layer.lo, layer.hi) == (0, 12) and (layer._k.data_ptr(), layer._v.data_ptr()) == buffers
    assert torch.equal(layer.keys[2:, :, :4], n) and torch.equal(layer.keys[:2, :, 1:4], k[[2, 0], :, 2:])
    assert torch.equal(layer.keys[:, :, 4:], step.expand(4, 1, 8, 2))
    layer.update(torch.ones(4, 1, 2, 2), torch.ones(4, 1, 2, 2))  # no room left: it grows, keeping the values
    assert layer.capacity == 24 and layer.get_seq_length() == 14 and torch.equal(layer.keys[2:, :, :4], n)


def test_models_with_sliding_window_layers_keep_transformers_cache():
    config = sliding_window_config()

    class Stub:
        pass

    model = Stub()
    model.config = config
    assert preallocated_cache(model, 32) is None


def test_a_batch_is_finished_while_the_next_batch_runs(tiny_model, runtime, monkeypatch):
    """Finishing batch 0 waits for batch 1 to start: serial finishing would time out here."""
    next_started = threading.Event()
    threads: list[str] = []
    real_run, real_finish = engine.run_batch, engine.finish_batch

    def run_batch(lm, decoding, prompts, seeds, slots=None):
        if threads:  # a batch after the first
            next_started.set()
        return real_run(lm, decoding, prompts, seeds, slots)

    def finish_batch(tok, decoding, raw):
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            assert next_started.wait(timeout=30), "batch 0 was finished before batch 1 started: no overlap"
        return real_finish(tok, decoding, raw)

    monkeypatch.setattr(engine, "run_batch", run_batch)
    monkeypatch.setattr(engine, "finish_batch", finish_batch)
    spec = job(tiny_model, "greedy", batch_size=2, max_new=6, prompts=PROMPTS[:4])
    spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"refill": False})})
    configure("json")  # the job's log lines are captured for its log.jsonl
    with job_context(job_id="overlap") as lines:
        result, records = generate_job(spec, runtime)
    assert next_started.is_set() and all(name.startswith("decodebench-finish") for name in threads)
    assert [r.prompt_id for r in records] == ["p0", "p1", "p2", "p3"] and len(result.batches) == 2
    done = [line for line in lines if line.get("event") == "batch.done"]
    assert len(done) == 2 and all(line.get("job_id") == "overlap" for line in done)  # the job's context came along


def test_overlapped_job_equals_batches_run_one_after_another(tiny_model, runtime):
    spec = job(tiny_model, "top_k", {"k": 20}, seed=3, batch_size=2, max_new=10, stop=["."], prompts=PROMPTS)
    _, records = generate_job(spec, runtime)
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    decoding = planning.configure(lm, spec.strategy, spec.generation)
    for batch in sorted({r.batch for r in records}):
        rows = [r for r in records if r.batch == batch]
        prompts = [p for p in spec.prompts if p.id in {r.prompt_id for r in rows}]
        alone = engine.generate_batch(lm, decoding, prompts, [r.seed for r in rows])
        assert alone.texts == [r.text for r in rows] and alone.token_ids == [r.token_ids for r in rows]
