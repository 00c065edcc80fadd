"""The decode step in three parts (issue 40): the model call, the token choice and the loop that schedules.

The parts' outputs are the recorded golden tokens (tests/unit/worker/engine/test_golden.py); these tests hold the
shape: the batch-size probe runs the loop's own model call, a plugin's chooser inherits the one `advance`, the warm-up
runs on the plan's own path, the plan carries no hidden keys, and the engine takes the pod and node names
from the settings table at the edge.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.engine import job
from tests.support.repo import REPO
from worker.core.contract import GenerationSettings, ModelSpec, StrategySpec
from worker.engine import batching
from worker.engine.call import ModelCall
from worker.engine.job import EngineSettings, Runtime, plan_job
from worker.engine.plan import Path, configure
from worker.engine.sampling import SAMPLING_KEYS


def test_the_batch_size_probe_runs_the_loops_own_model_call(tiny_model, runtime, monkeypatch):
    """The CUDA probe holds what the loop holds because it is the loop's call: its prefills and its decode step
    go through `ModelCall` (here on the CPU), with the plan's prepared mask."""
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    plan = configure(lm, StrategySpec(name="greedy"), GenerationSettings())
    seen = []
    for name in ("prefill", "forward"):
        real = getattr(ModelCall, name)
        monkeypatch.setattr(
            ModelCall, name, lambda self, *a, _n=name, _r=real, **k: seen.append(_n) or _r(self, *a, **k)
        )
    batching.probe_step(plan.call(lm.model), 3, 24, batching.LoopPeak(8, stream=True), runtime.device)
    assert seen == ["prefill", "prefill", "forward"]  # the batch's prefill, an admission's, one decode step


def test_a_plugin_writes_choose_only_and_shares_the_loops_advance():
    from decodebench_mirostat.step import MirostatStep

    from worker.engine.choose import Chooser
    from worker.engine.custom import TokenStep

    assert TokenStep.advance is Chooser.advance and MirostatStep.advance is Chooser.advance
    assert "choose" in vars(MirostatStep) and "advance" not in vars(TokenStep)


def test_the_warm_up_runs_on_the_plans_own_path(tiny_model, monkeypatch):
    """A job on the decode loop warms the loop's kernels (its model call), not generate()'s."""
    fresh = Runtime("cpu")  # a model not warmed yet
    lm = fresh.cache.get(ModelSpec(path=tiny_model), fresh.device)
    generated, forwards = [], []
    monkeypatch.setattr(lm.model, "generate", lambda *a, **k: generated.append(1))
    real = ModelCall.forward
    monkeypatch.setattr(ModelCall, "forward", lambda self, *a: forwards.append(1) or real(self, *a))
    plan, batches = plan_job(job(tiny_model, "greedy", batch_size=2, prompts=["Anne", "Emma"]), fresh, lm)
    assert plan.path is Path.DECODE and plan.warmup and lm.warmed
    assert generated == [] and forwards  # the warm-up's two tokens: one decode step of the loop
    assert [size for size, _ in batches.groups] == [2]


def test_a_job_on_other_code_of_a_warmed_model_is_warmed_too(tiny_model):
    """The warm-up ran once per loaded model: a job whose batches run other code (transformers' generate() with a
    static cache, which compiles the forward pass on CUDA) after a decode-loop job on the same model had none, and
    its first timed batch paid for what a warm-up pays. The same code again is not warmed twice."""
    from tests.support.engine import with_generation

    fresh = Runtime("cpu")
    lm = fresh.cache.get(ModelSpec(path=tiny_model), fresh.device)
    passes = []
    handle = lm.model.register_forward_hook(lambda *_: passes.append(1))
    try:
        warmed = []
        for static in (False, True, True):
            spec = with_generation(
                job(tiny_model, "greedy", batch_size=2, prompts=["Anne", "Emma"]), static_cache=static
            )
            passes.clear()
            plan, _ = plan_job(spec, fresh, lm)
            warmed.append((plan.path, bool(passes)))
    finally:
        handle.remove()
    assert warmed == [(Path.DECODE, True), (Path.GENERATE, True), (Path.GENERATE, False)]


def test_the_plan_holds_the_sampler_settings_only_and_its_rules_once(tiny_model, runtime):
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    plan = configure(lm, StrategySpec(name="top_p", params={"p": 0.9}), GenerationSettings(stop=["."]))
    assert set(plan.sampler) == set(SAMPLING_KEYS)  # no hidden device key
    assert plan.rules.warpers is not None and plan.rules.stop is not None
    short = plan.shortened(2, None)
    assert short.rules.ends.max_new == 2 and short.rules.stop is plan.rules.stop
    assert plan.rules.ends.max_new == plan.config.max_new_tokens
    chooser = plan.chooser(None, 3, "cpu")
    assert chooser.tokens.shape == (3, plan.rules.ends.max_new + 1) and chooser.rows_each == 1
    on_generate = dataclasses.replace(plan, step=None)  # a plan whose batches generate() runs
    assert on_generate.path is Path.GENERATE
    with pytest.raises(ValueError, match="has no chooser"):
        on_generate.chooser(None, 3, "cpu")


def test_the_pod_and_node_names_are_settings_given_at_the_edge(monkeypatch):
    import re

    root = REPO
    readers = [
        str(p.relative_to(root))
        for p in (root / "worker").rglob("*.py")
        if re.search(r"environ(\.get)?\(?\[?[\"'](POD|NODE)_NAME", p.read_text())
    ]
    assert readers == []  # the settings table reads them, as every other setting
    monkeypatch.setenv("POD_NAME", "worker-7")
    monkeypatch.setenv("NODE_NAME", "node-3")
    engine = EngineSettings.from_environment()
    assert (engine.pod, engine.node) == ("worker-7", "node-3")


def test_the_decode_outputs_carry_no_kv_cache_string():
    """The cache the loop ran over is the plan's, recorded once (result.json's engine.kv_cache)."""
    from worker.engine import decode
    from worker.engine import generate as gen

    for kind in (decode.DecodeOutput, gen.RawBatch, gen.BatchOutput):
        assert "kv_cache" not in {f.name for f in dataclasses.fields(kind)}, kind


def test_a_checkpoint_s_content_hash_is_read_once_while_its_files_are_unchanged(tmp_path, tiny_model, monkeypatch):
    """A resumed local sweep hashes its model before the jobs load it (controller.launch.local.check_model_files):
    the load's own hash, recorded in result.json, reads no weights again; a file written since is hashed afresh."""
    import pathlib
    import shutil

    from worker.engine import checkpoint

    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    first = checkpoint.content_hash(model)
    opened = []
    real = pathlib.Path.open
    monkeypatch.setattr(pathlib.Path, "open", lambda self, *a, **k: opened.append(self.name) or real(self, *a, **k))
    assert checkpoint.content_hash(model) == first and opened == []
    with real(model / "config.json", "a") as f:
        f.write(" ")
    assert checkpoint.content_hash(model) != first and "model.safetensors" in opened


def test_the_provenance_hash_leaves_a_jinja_template_out_and_the_judges_takes_it(tmp_path, tiny_model):
    """result.json's content_hash is what a resumed sweep is checked against: a chat_template.jinja (which
    transformers 5 writes beside a tokenizer with a template) counted in it would have refused every resume of a
    sweep run before, files unchanged. A local judge's key (`templates=True`) counts it."""
    import shutil

    from worker.engine import checkpoint

    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    plain, judged = checkpoint.content_hash(model), checkpoint.content_hash(model, templates=True)
    (model / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert checkpoint.content_hash(model) == plain
    assert checkpoint.content_hash(model, templates=True) != judged
