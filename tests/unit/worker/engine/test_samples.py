"""`samples: n` on the own engine (issue 38, part 3): one prefill a prompt for its n samples (counted on the
bundled model's forward passes), each sample's tokens reproducible with its own seed whatever the batch,
records that carry the prompt id and the sample, and best_of keeping the sample the model scores highest."""

from __future__ import annotations

import pytest

from tests.support.engine import job, with_generation
from tests.support.services import AUSTEN_PROMPTS, TINY_MODEL
from worker.core.contract import StrategySpec

PROMPTS = AUSTEN_PROMPTS[:4]
N = 3


def sampled(strategy="top_p", params=None, samples=N, best_of=None, **settings):
    spec = job(TINY_MODEL, strategy, params or {"p": 0.9}, seed=3, max_new=8, prompts=PROMPTS)
    spec = spec.model_copy(
        update={"strategy": StrategySpec(name=strategy, params=params or {"p": 0.9}, samples=samples, best_of=best_of)}
    )
    return with_generation(spec, **{"warmup": False, **settings})


class PrefillCounter:
    """Counts the prompt rows the model is given in prefills (forward passes over more than one position)."""

    def __init__(self, model) -> None:
        self.rows = 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            self.rows += ids.shape[0]

    def close(self):
        self.handle.remove()


@pytest.mark.parametrize("settings", [{"batch_size": 1}, {"batch_size": 3, "refill": False}, {"batch_size": 8}])
def test_n_samples_come_from_one_prefill_of_each_prompt(runtime, settings):
    """A stream with refill, plain batches and one batch: the model prefills each prompt once, not n times, and
    every prompt gets its n generations."""
    from worker.engine.job import generate_job
    from worker.engine.models import prepared_mask

    spec = sampled(**settings)
    lm = runtime.cache.get(spec.model, runtime.device)
    prepared_mask(lm.model)  # the model's once-only probe (two rows through the model) before the count
    counter = PrefillCounter(lm.model)
    try:
        result, records = generate_job(spec, runtime)
    finally:
        counter.close()
    assert counter.rows == len(PROMPTS)
    assert len(records) == result.n_generations == len(PROMPTS) * N
    assert [(r.prompt_id, r.sample) for r in records] == [(f"p{i}", s) for i in range(len(PROMPTS)) for s in range(N)]
    assert result.engine["plan"]["samples"] == N and result.engine["plan"]["rows_per_prompt"] == N
    assert result.provenance["samples"] == N and result.job.strategy.samples == N


def test_each_sample_has_its_own_seed_and_reproduces_whatever_the_batch(runtime):
    """A sample's tokens depend on its seed only: the same in a stream, in plain batches, one prompt at a time
    and in a second run; sample 0 is the generation of the same job without samples; the samples differ."""
    from worker.engine.job import generate_job
    from worker.engine.sampling import generation_seed

    runs = [
        generate_job(sampled(**settings), runtime)[1]
        for settings in (
            {"batch_size": 2},
            {"batch_size": 3, "refill": False},
            {"batch_size": 1},
            {"batch_size": "auto"},
        )
    ]
    first = [(r.prompt_id, r.sample, r.seed, r.token_ids) for r in runs[0]]
    for other in runs[1:]:
        assert [(r.prompt_id, r.sample, r.seed, r.token_ids) for r in other] == first
    for r in runs[0]:
        assert r.seed == generation_seed(3, r.prompt_id, r.sample) and r.job_seed == 3
    assert len({r.seed for r in runs[0]}) == len(runs[0])
    for i in range(len(PROMPTS)):
        assert len({tuple(r.token_ids) for r in runs[0] if r.prompt_id == f"p{i}"}) > 1  # not one sample n times
    plain = generate_job(sampled(samples=None, batch_size=2), runtime)[1]
    assert [r.token_ids for r in plain] == [r.token_ids for r in runs[0] if r.sample == 0]
    assert all(r.sample == 0 and r.best_of is None for r in plain)


def test_a_samples_seed_never_collides_with_another_prompts():
    """A later sample's seed is keyed so that no prompt id can spell it (a prompt "a:1" is not sample 1 of "a")."""
    from worker.engine.sampling import generation_seed

    assert generation_seed(0, "a", 1) != generation_seed(0, "a:1")
    assert generation_seed(0, "a", 0) == generation_seed(0, "a")
    assert len({generation_seed(0, "a", i) for i in range(64)}) == 64


def test_best_of_keeps_the_sample_the_model_scores_highest(runtime):
    """best_of by the model: one record a prompt, the sample with the highest mean token log-probability among
    the n the samples job writes (the same seeds, so the same tokens), each sample's score recorded."""
    from worker.engine.job import generate_job
    from worker.engine.scoring import score_nll

    result, kept = generate_job(sampled(best_of="model", batch_size=3), runtime)
    _, every = generate_job(sampled(batch_size=3), runtime)
    lm = runtime.cache.get(sampled().model, runtime.device)
    prompt_ids = dict(zip((f"p{i}" for i in range(len(PROMPTS))), lm.tokenizer(PROMPTS)["input_ids"]))
    nlls = score_nll(lm, [(prompt_ids[r.prompt_id], r.token_ids) for r in every], 8)
    assert len(kept) == result.n_generations == len(PROMPTS)
    for record in kept:
        samples = [(r, nll) for r, nll in zip(every, nlls) if r.prompt_id == record.prompt_id]
        means = [-total / count for _, (total, count) in samples]
        assert record.best_of == pytest.approx(means, rel=1e-4)
        assert record.sample == max(range(N), key=lambda i: (means[i], -i))
        assert record.token_ids == samples[record.sample][0].token_ids and record.seed == samples[record.sample][0].seed
    assert len({r.sample for r in kept}) > 1 or any(r.sample for r in kept)  # not simply sample 0 each time
    assert any("best_of" in note for note in result.notes)
    assert result.new_tokens < sum(b.new_tokens for b in result.batches)  # all samples generated, the best kept


def test_a_forged_job_with_samples_on_a_deterministic_strategy_fails_in_one_line(runtime):
    from worker.core.errors import PermanentJobError
    from worker.engine.job import generate_job

    spec = job(TINY_MODEL, "greedy", seed=3, max_new=4, prompts=PROMPTS[:1])
    spec = spec.model_copy(update={"strategy": StrategySpec(name="greedy", samples=2)})
    with pytest.raises(PermanentJobError, match="samples: strategy greedy is deterministic"):
        generate_job(spec, runtime)


SWEEP = """
name: samples-e2e
models: [{{path: {model}, name: tiny}}]
prompts: {{inline: ["It was a truth", "She had never", "Mr. Darcy said"]}}
strategies:
  - {{name: top_p, params: {{p: 0.9}}, samples: 3}}
  - {{name: top_p, params: {{p: 0.9}}}}
generation: {{max_new_tokens: 6, batch_size: 2, seeds: [0, 1]}}
metrics: [distinct_1, mean_length]
"""


def test_a_local_run_keeps_every_sample_in_the_report(tmp_path):
    """decodebench run: each seed's job writes 3 samples a prompt, and the report counts all of them (seeds x
    samples a prompt), in a cell of its own labelled with its samples."""
    import json

    import pandas as pd
    from click.testing import CliRunner

    from controller.cli import main

    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP.format(model=TINY_MODEL))
    result = CliRunner().invoke(main, ["--log-level", "warning", "run", str(spec), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    (sweep,) = (tmp_path / "runs" / "default" / "sweeps").iterdir()
    summary = pd.read_csv(sweep / "report" / "summary.csv")
    by_samples = {("plain" if pd.isna(row["samples"]) else int(row["samples"])): row for _, row in summary.iterrows()}
    assert by_samples[3]["n_generations"] == 3 * 2 * 3 and by_samples[3]["n_prompts"] == 3
    assert by_samples["plain"]["n_generations"] == 3 * 2
    records = [json.loads(line) for f in sweep.glob("jobs/*/generations.jsonl") for line in f.read_text().splitlines()]
    sampled = [r for r in records if r["cell"].endswith("[samples=3]")]
    assert len({(r["job_seed"], r["prompt_id"], r["sample"]) for r in sampled}) == len(sampled) == 18
    assert {r["sample"] for r in sampled} == {0, 1, 2} and len({r["prompt_id"] for r in sampled}) == 3
    lines = result.output.splitlines()  # the cell's label carries its samples (docs/reports.md, "Labels")
    assert any(line.startswith("| tiny | top_p[samples=3] | 18 |") for line in lines), result.output
