"""Every sample of a variant with `samples` is judged: pairwise against the baseline's same (prompt, seed, sample),
else its answer to that prompt and seed, else a deterministic baseline's only answer; single, each sample graded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from controller.judge.run import answers_of, items_of, verdicts
from controller.judge.templates import load_template
from controller.sweep.judgespec import JudgeSpec

pytestmark = pytest.mark.pure


class Store:
    """The generations of each job, as the store gives them back (`load_generations`)."""

    def __init__(self, jobs: dict[str, list]):
        self.jobs = jobs

    def load_generations(self, tenant, sweep_id, job_id, sha256):
        return self.jobs[job_id]


def gen(cell: str, pid: str, seed: int, sample: int = 0) -> SimpleNamespace:
    return SimpleNamespace(cell=cell, prompt_id=pid, job_seed=seed, sample=sample, prompt=f"prompt {pid}",
                           text=f"{cell} {pid} seed {seed} sample {sample}")  # fmt: skip


def judged(jobs: dict[str, list], bases: dict, **judge):
    store = Store(jobs)
    results = [SimpleNamespace(job=SimpleNamespace(cell=gs[0].cell, job_id=j), generations_sha256=None)
               for j, gs in jobs.items()]  # fmt: skip
    spec = JudgeSpec.model_validate({"url": "http://127.0.0.1:1/v1", "model": "m", **judge})
    template = load_template(spec.mode, None)
    return spec, template, items_of(spec, template, answers_of(store, "t", "s", results), bases)


def test_every_sample_is_judged_against_the_baselines_same_sample_where_it_has_one():
    # a variant with 3 samples of 2 prompts at seeds 0 and 1, against a sampled baseline with 2 samples each
    variant = [gen("v", p, seed, k) for p in ("p0", "p1") for seed in (0, 1) for k in range(3)]
    base = [gen("b", p, seed, k) for p in ("p0", "p1") for seed in (0, 1) for k in range(2)]
    spec, template, items = judged({"jv": variant, "jb": base}, {"b": None, "v": "b"})
    assert len(items) == 12  # before: 4, one sample of each prompt and seed
    texts = {(it.prompt_id, it.job_seed, it.sample): it.requests[0].body["messages"][-1]["content"] for it in items}
    assert "v p1 seed 1 sample 2" in texts[("p1", 1, 2)]
    assert "b p1 seed 1 sample 1" in texts[("p1", 1, 1)]  # sample 1 against the baseline's sample 1
    assert "b p1 seed 1 sample 0" in texts[("p1", 1, 2)]  # the baseline has no sample 2: its first of that seed
    assert "b p1 seed 1 sample 0" not in texts[("p1", 1, 1)]
    replies = {r.digest: ("[[A]]", 1) for it in items for r in it.requests}
    records = verdicts(spec, template, items, replies)
    assert {(r["prompt_id"], r["job_seed"], r["sample"]) for r in records} == set(texts)
    by = {(r["job_seed"], r["sample"]): (r["baseline_job_seed"], r["baseline_sample"]) for r in records}
    assert by[(1, 1)] == (1, 1) and by[(1, 2)] == (1, 0)


def test_a_deterministic_baselines_only_answer_stands_against_every_seed_and_sample():
    variant = [gen("v", "p0", seed, k) for seed in (0, 1) for k in range(2)]
    spec, template, items = judged({"jv": variant, "jb": [gen("b", "p0", 0)]}, {"b": None, "v": "b"})
    assert sorted((it.job_seed, it.sample) for it in items) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {it.against for it in items} == {(0, 0)}
    assert all("b p0 seed 0 sample 0" in it.requests[0].body["messages"][-1]["content"] for it in items)


def test_single_mode_grades_every_sample():
    variant = [gen("v", "p0", 0, k) for k in range(4)]
    spec, template, items = judged({"jv": variant}, {"v": None}, mode="single", criteria=["overall", "fluency"])
    assert sorted({it.sample for it in items}) == [0, 1, 2, 3] and len(items) == 8  # before: 2
    records = verdicts(spec, template, items, {r.digest: ("[[7]]", 1) for it in items for r in it.requests})
    assert sorted(r["sample"] for r in records if r["criterion"] == "overall") == [0, 1, 2, 3]
