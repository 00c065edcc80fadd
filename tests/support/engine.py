"""Shared pieces of the engine's tests: the one JobSpec factory (`job`), a spec with other generation
settings, transformers' unbatched
greedy run of one prompt (what every batched, compacted or streamed row must equal), small
random-weight configs of the model families the engine supports, the prompt pool of the stream
property tests and the guard that no KV buffer grows."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from transformers import MistralConfig

from tests.support.services import AUSTEN_PROMPTS
from worker.core.contract import ModelSpec
from worker.engine.job import generate_job

# prompts of very different lengths (1 to about 30 tokens)
MIXED = [
    "Anne",
    "It was a truth universally acknowledged, that a single man in possession of a good fortune, must be in want",
    "She had never seen",
    *AUSTEN_PROMPTS[1:6],
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed",
]

POOL = [*MIXED, "Anne", "Emma", "It was", "Mr. Darcy said that he had never"]


def job(
    model,
    strategy: str = "greedy",
    params=None,
    batch_size=4,
    seed=0,
    max_new=16,
    stop=(),
    metrics=(),
    prompts=AUSTEN_PROMPTS,
    *,
    dtype: str = "auto",
    scorer=None,
    job_id: str | None = None,
    **model_options,
):
    """A one-shard job of the test sweep; it computes what its metrics need (default: distinct_1), as the
    planner writes it."""
    from controller.metrics.registry import worker_needs
    from worker.core.contract import GenerationSettings, JobSpec, PromptItem, StrategySpec

    metrics = list(metrics) or ["distinct_1"]
    return JobSpec(
        tenant="default",
        sweep_id="s",
        sweep_name="t",
        job_id=job_id or f"j-{strategy}-{batch_size}-{seed}",
        cell=f"m::{strategy}",
        model=ModelSpec(path=str(model), dtype=dtype, **model_options),
        strategy=StrategySpec(name=strategy, params=params or {}),
        seed=seed,
        shard=0,
        n_shards=1,
        prompts=[PromptItem(id=f"p{i}", prompt=p) for i, p in enumerate(prompts)],
        generation=GenerationSettings(max_new_tokens=max_new, batch_size=batch_size, stop=list(stop)),
        metrics=metrics,
        compute=worker_needs(metrics),
        scorer=ModelSpec(path=scorer) if scorer else None,
    )


def texts(runtime, spec):
    """The job's texts, records and result."""

    result, records = generate_job(spec, runtime)
    return [r.text for r in records], records, result


def with_generation(spec, **update):
    return spec.model_copy(update={"generation": spec.generation.model_copy(update=update)})


def unbatched_greedy(lm, prompt: str, max_new: int, **settings) -> list[int]:
    """transformers' generate() on the prompt alone (`settings`: more generate() arguments, e.g. penalties)."""
    enc = lm.tokenizer(prompt, return_tensors="pt")
    pad = lm.tokenizer.pad_token_id
    with torch.inference_mode():
        out = lm.model.generate(**enc, do_sample=False, max_new_tokens=max_new, pad_token_id=pad, **settings)
    return out[0, enc["input_ids"].shape[1] :].tolist()


def small_config(family: str):
    """A 2-layer random-weight config of `family` over the bundled tokenizer's 4096 ids (0: bos, eos, pad)."""
    from transformers import AutoConfig

    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=4096)
    ids = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "gpt2":
        return AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=4, vocab_size=4096, **ids)
    if family == "gpt_neox":
        return AutoConfig.for_model(family, **shape, **ids)
    extra = {"sliding_window": None} if family == "mistral" else {}
    return AutoConfig.for_model(family, **shape, num_key_value_heads=2, head_dim=8, **extra, **ids)


@contextmanager
def forbid_growth(tight: bool):
    """KV buffers that must never grow (a stream's are planned: decode.stream_span); with `tight`, the
    fewest columns the stream's bound allows (decode.stream_span without its reserve and spare columns),
    so that the window slides whenever it can. Yields the list that records each check's slide (True) or
    not."""
    from worker.engine import decode, kvcache

    def grow(self, rows, columns):
        raise AssertionError(f"a KV buffer grew to {rows} x {columns} (capacity {self.capacity})")

    slides, real_room = [], decode.room

    def room(cache, steps):
        slides.append(real_room(cache, steps))
        return slides[-1]

    with pytest.MonkeyPatch.context() as patch:  # undone after each hypothesis example
        patch.setattr(kvcache.PreallocatedLayer, "_resize", grow)
        patch.setattr(decode, "room", room)
        if tight:
            patch.setattr(decode, "stream_span", lambda longest, max_new, every: longest + max(max_new - 2, 0) + every)
        yield slides


def forward_widths(lm, spec, runtime, monkeypatch):
    """One run of the job after a warm-up run (the model's own warm-up generate() takes decode steps of its
    own), recording the width of every input the model is given: (result, records, widths)."""
    import functools

    generate_job(spec, runtime)
    widths = []
    real_forward = lm.model.forward

    @functools.wraps(real_forward)
    def forward(*args, **kwargs):
        widths.append(kwargs["input_ids"].shape[1])
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)
    try:
        result, records = generate_job(spec, runtime)
    finally:
        monkeypatch.setattr(lm.model, "forward", real_forward)
    return result, records, widths


class CudaProbe:
    """`batch_size: auto` as a CUDA runtime answers it, with the fit probe recorded instead of run: it says
    `fit(length, cap)` rows fit (default 8): `probe(lm, decoding, spec)` -> (size, info) and
    `plan(lm, decoding, spec)` -> the job's planned groups, the scorer's size and the record; `asked`
    lists each probe's (length, rows per prompt), `peaks` its own-loop peak. One instance is one
    runtime's cache of sizes."""

    def __init__(self, runtime, monkeypatch, fit=lambda length, cap: 8) -> None:
        from types import SimpleNamespace

        from worker.engine import batching

        self.asked: list[tuple[int, int]] = []
        self.peaks: list = []  # each probe's batching.LoopPeak (None: generate()'s one-pass probe)

        def cuda_fit(model, dev, length, each, cap, peak=None):
            self.asked.append((length, each))
            self.peaks.append(peak)
            return fit(length, cap), {}

        monkeypatch.setattr(batching, "cuda_fit", cuda_fit)
        self.runtime = SimpleNamespace(
            device=SimpleNamespace(type="cuda"),
            cache=runtime.cache,
            batch_sizes=batching.AutoBatch(),
            settings=runtime.settings,
        )

    def probe(self, lm, decoding, spec):
        from worker.engine import batching

        lengths = [len(lm.tokenizer(p.prompt)["input_ids"]) for p in spec.prompts]
        return batching.auto_batch_size(self.runtime, lm, decoding, spec, lengths)

    def plan(self, lm, decoding, spec):
        from worker.engine.job import plan_batches

        lengths = [len(lm.tokenizer(p.prompt)["input_ids"]) for p in spec.prompts]
        planned = plan_batches(spec, self.runtime, lm, decoding, lengths)
        return planned.groups, planned.scorer_size, planned.record


def sliding_window_config(vocab_size: int = 100) -> MistralConfig:
    """A 2-layer Mistral whose layers are sliding-window ones (ids 0 for bos, eos and pad)."""
    return MistralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        sliding_window=4,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
