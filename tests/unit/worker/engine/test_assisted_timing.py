"""What an assisted job's timings measure: the strategy's draft length, the model's own first logits, and no
one-time cost in a timed batch (docs/metrics.md#speed-and-memory-columns)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.engine import job
from tests.support.services import AUSTEN_PROMPTS
from worker.engine import generate as gen
from worker.engine.job import plan_job
from worker.engine.timing import StepClock


def _assisted(runtime, small_model, tiny_model, **params):
    spec = job(small_model, "assisted", {"assistant": tiny_model, **params}, batch_size=1, max_new=20)
    lm = runtime.cache.get(spec.model, runtime.device)
    plan, _ = plan_job(spec, runtime, lm)
    return spec, lm, plan


def test_the_draft_length_is_the_strategys(tiny_model, small_model, runtime):
    """transformers reads the draft length from the draft model's own generation config, never from the one
    generate() is given: `num_assistant_tokens` changed nothing (drafts of up to 20 tokens at 1). A heuristic
    schedule's state, written back to the shared draft model, does not reach the next job either, nor does the
    strategy's setting stay on the draft model (a job of its own records its generation config)."""
    spec, lm, plan = _assisted(runtime, small_model, tiny_model, num_assistant_tokens=6, schedule="heuristic")
    own = plan.assistant.model.generation_config.to_dict()
    gen.run_batch(lm, plan, spec.prompts[:1], [0])
    assert plan.assistant.model.generation_config.to_dict() == own
    spec, lm, plan = _assisted(runtime, small_model, tiny_model, num_assistant_tokens=1)
    fed = []  # tokens each forward pass of the model takes: its prefill, then the last token and the drafts

    def record(module, args, kwargs, output):
        fed.append(kwargs["input_ids"].shape[1])

    handle = lm.model.register_forward_hook(record, with_kwargs=True)
    try:
        for prompt in spec.prompts[:3]:
            fed.clear()
            gen.run_batch(lm, plan, [prompt], [0])
            assert len(fed) > 2 and max(fed[1:]) <= 2, fed  # one drafted token a pass, with the last accepted
    finally:
        handle.remove()


def test_time_to_first_token_is_the_models_first_logits(tiny_model, small_model, runtime, monkeypatch):
    """generate() hands its logits processors to the draft model's generate() too: the clock's first stamp was
    the draft's first logits, before the model had computed anything (TTFT a third of the real one)."""
    spec, lm, plan = _assisted(runtime, small_model, tiny_model)
    events: list[str] = []

    class Recorded(StepClock):
        def tick(self) -> None:
            events.append("stamp")
            super().tick()

        def __call__(self, input_ids, scores):
            events.append("stamp")
            return super().__call__(input_ids, scores)

    monkeypatch.setattr(gen, "StepClock", Recorded)
    hooks = [
        plan.assistant.model.register_forward_hook(lambda *_: events.append("draft")),
        lm.model.register_forward_hook(lambda *_: events.append("model")),
    ]
    try:
        raw = gen.run_batch(lm, plan, spec.prompts[:1], [0])
    finally:
        for h in hooks:
            h.remove()
    assert "draft" in events[: events.index("model")]  # the draft proposes before the model's first pass
    assert events.index("stamp") == events.index("model") + 1, events[:12]
    assert 0 < raw.times.prefill_s < raw.times.total_s


def test_a_timed_batch_imports_nothing(tiny_model, small_model):
    """transformers imports scikit-learn in the first call that tunes the draft's confidence threshold, which
    the short warm-up never reaches: over a second inside the job's first timed batch (1.2 s against 0.2 s).
    In a fresh interpreter, as a worker's first assisted job."""
    script = textwrap.dedent(
        f"""
        import sys
        from tests.support.engine import job
        from worker.engine import generate as gen
        from worker.engine.job import Runtime, plan_job

        runtime = Runtime("cpu")
        params = {{"assistant": {tiny_model!r}}}
        spec = job({small_model!r}, "assisted", params, max_new=20, prompts={AUSTEN_PROMPTS[:4]!r})
        lm = runtime.cache.get(spec.model, runtime.device)
        plan, _ = plan_job(spec, runtime, lm)  # the warm-up
        before = set(sys.modules)
        for prompt in spec.prompts:
            gen.run_batch(lm, plan, [prompt], [0])
        print(sorted(set(sys.modules) - before))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
