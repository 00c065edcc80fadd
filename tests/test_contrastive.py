"""Contrastive search's loop: finished rows leave the candidate pass, and a row's candidates run over the
row's own cache (k tokens, a diagonal mask) where the model takes the prepared mask, choosing what the
original repeated-cache step chooses. (The paper's cache-free check is in test_engine.)"""

from __future__ import annotations

import pytest
import torch

from tests.helpers_engine import small_config
from tests.test_engine import job
from tests.test_throughput import MIXED
from worker.core.contract import ModelSpec
from worker.engine.decode import _MASK_PASSTHROUGH as MASK_PASSTHROUGH
from worker.engine.job import generate_job


def test_contrastive_search_drops_finished_rows_from_its_candidate_pass(small_model, runtime, monkeypatch):
    """Rows that end (a stop string) leave the k-candidate forward; every row is still its unbatched run."""
    import functools

    from worker.engine.decode import prepared_mask

    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    prepared_mask(lm.model)  # the once-per-model mask check, before forward passes are counted
    rows_seen = []
    real_forward = lm.model.forward

    @functools.wraps(real_forward)
    def forward(*args, **kwargs):
        rows_seen.append(kwargs["input_ids"].numel())  # candidate tokens: live rows x k (either path)
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)

    def contrastive(prompts, batch_size):
        params = {"k": 4, "alpha": 0.6}
        spec = job(small_model, "contrastive", params, batch_size, max_new=16, stop=[","], prompts=prompts)
        spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"warmup": False})})
        return generate_job(spec, runtime)[1]

    batched = contrastive(MIXED, len(MIXED))
    candidate_rows = rows_seen[1:]  # after the prefill: live rows x k candidate tokens
    assert candidate_rows[0] == 4 * len(MIXED) and min(candidate_rows) < candidate_rows[0]
    assert {r.stop_reason for r in batched} >= {"stop_string"}
    alone = [contrastive([p], 1)[0] for p in MIXED]
    assert [(r.token_ids, r.stop_reason) for r in batched] == [(r.token_ids, r.stop_reason) for r in alone]


@pytest.mark.parametrize("family", ["austen", *sorted(MASK_PASSTHROUGH)])
def test_contrastive_candidates_as_tokens_of_their_row_choose_what_repeated_caches_choose(
    family, small_model, tiny_model, runtime, tmp_path, monkeypatch
):
    """Contrastive search's shared-cache step (k candidates as k tokens of the row, a diagonal mask, no
    cache copies) against the repeated-cache step of the original implementation: the same tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.engine.loops import contrastive

    model = small_model
    if family != "austen":
        torch.manual_seed(4)
        AutoModelForCausalLM.from_config(small_config(family)).save_pretrained(tmp_path)
        AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
        model = str(tmp_path)
    steps = []
    for name in ("_shared", "_repeated"):
        real = getattr(contrastive, name)
        monkeypatch.setattr(contrastive, name, lambda *a, real=real, name=name: steps.append(name) or real(*a))
    spec = job(model, "contrastive", {"k": 4, "alpha": 0.6}, batch_size=4, max_new=12, stop=[","], prompts=MIXED)
    _, shared = generate_job(spec, runtime)
    assert steps and set(steps) == {"_shared"}  # candidates ran as 4 tokens of their row
    monkeypatch.setattr(contrastive, "prepared_mask", lambda model: False)
    steps.clear()
    _, repeated = generate_job(spec, runtime)
    assert steps and set(steps) == {"_repeated"}  # one token per row, the cache repeated 4 times
    assert [(r.token_ids, r.stop_reason) for r in shared] == [(r.token_ids, r.stop_reason) for r in repeated]


def test_looking_for_finished_rows_every_8_steps_as_on_cuda_changes_no_output(small_model, runtime, monkeypatch):
    """On CUDA the loop looks for finished rows every 8 steps (a look is a host synchronisation): rows leave
    the candidate pass only then, and every generation is what looking every step gives."""
    import functools

    from worker.engine import generate as engine
    from worker.engine.decode import prepared_mask

    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    prepared_mask(lm.model)
    spec = job(small_model, "contrastive", {"k": 4, "alpha": 0.6}, len(MIXED), max_new=20, stop=[","], prompts=MIXED)
    _, every_step = generate_job(spec, runtime)
    tokens = []
    real_forward = lm.model.forward

    @functools.wraps(real_forward)
    def forward(*args, **kwargs):
        tokens.append(kwargs["input_ids"].numel())
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)
    monkeypatch.setattr(engine, "check_every", lambda device: 8)
    _, every_8 = generate_job(spec, runtime)
    passes = tokens[1:]  # after the prefill: the candidate passes, one per step
    changes = [i for i in range(1, len(passes)) if passes[i] != passes[i - 1]]
    assert changes and all(i % 8 == 0 for i in changes), passes
    assert [(r.token_ids, r.stop_reason, r.n_new_tokens) for r in every_8] == [
        (r.token_ids, r.stop_reason, r.n_new_tokens) for r in every_step
    ]


def test_the_loop_benchmark_runs_both_steps_and_checks_their_outputs_identical():
    """benchmarks/bench_loops.py at a smoke size: four pairs, each with identical outputs."""
    import subprocess
    import sys

    args = ["--prompts", "4", "--new", "4", "--rounds", "1"]
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_loops.py", *args], capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-2000:]
    pairs = [line for line in run.stdout.splitlines() if line.startswith("shared_vs_repeated")]
    assert len(pairs) == 4 and all(line.endswith("identical 4/4") for line in pairs), run.stdout
