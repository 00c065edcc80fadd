"""A strategy's `samples` and `best_of` in a sweep (issue 38, part 3): how they plan (seeds x samples
generations of a prompt, no extra jobs; ids of sweeps without them unchanged) and every bad input as one
line, exit 2."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.sweep.models import SweepSpec
from controller.sweep.plan import plan, summarize_plan
from tests.support.services import TINY_MODEL
from worker.core.contract import StrategySpec
from worker.core.policy import Limits, job_refusal

pytestmark = pytest.mark.pure

PROMPTS = ["It was", "She said", "Mr. Darcy"]


def spec(*strategies: dict, seeds=(0,), **more) -> SweepSpec:
    return SweepSpec(
        name="s",
        models=[{"path": "examples/models/austen-tiny"}],
        prompts={"inline": PROMPTS},
        strategies=list(strategies),
        generation={"seeds": list(seeds), "max_new_tokens": 8},
        **more,
    )


TOP_P = {"name": "top_p", "params": {"p": 0.9}}


def test_samples_multiply_each_seeds_generations_without_adding_jobs():
    """`samples: 4` with two seeds: two jobs (one per seed, as without samples), each 4 generations a prompt;
    its own cell beside the same variant without samples."""
    jobs = plan(spec({**TOP_P, "samples": 4}, TOP_P, seeds=(0, 1)))
    with_samples = [j for j in jobs if j.strategy.samples == 4]
    assert len(with_samples) == 2 and {j.seed for j in with_samples} == {0, 1}
    assert {j.cell for j in with_samples} == {"austen-tiny::top_p(p=0.9,temperature=1.0)[samples=4]"}
    assert len({j.cell for j in jobs}) == 2
    assert summarize_plan(jobs).generations == 2 * 3 * 4 + 2 * 3


def test_a_variant_without_samples_keeps_its_ids_and_payload():
    """The sweep id, the job ids and the job payload of a sweep without samples are those of the code before
    samples existed (pinned), and adding samples to a variant changes its ids."""
    jobs = plan(spec(TOP_P, {"name": "greedy"}, seeds=(0, 1)))
    assert jobs[0].sweep_id == "f7e87a97ccc0677b"
    assert [j.job_id for j in jobs] == ["10aa258b57630586", "06caaa7867ef9a69", "b7bee6a2751403bc"]
    assert "samples" not in jobs[0].model_dump()["strategy"] and "best_of" not in jobs[0].model_dump()["strategy"]
    sampled = plan(spec({**TOP_P, "samples": 2}, {"name": "greedy"}, seeds=(0, 1)))
    assert sampled[0].sweep_id != jobs[0].sweep_id
    best = plan(spec({**TOP_P, "samples": 2, "best_of": "model"}, {"name": "greedy"}, seeds=(0, 1)))
    assert best[0].job_id not in {j.job_id for j in sampled}
    assert best[0].cell.endswith("[best_of=2,by=model]")


def test_the_same_variant_with_and_without_samples_are_two_cells_but_a_repeat_is_one():
    jobs = plan(spec({**TOP_P, "samples": 3}, {**TOP_P, "samples": 3}, TOP_P))
    assert len(jobs) == 2


def test_a_job_over_the_samples_cap_is_refused_by_the_policy():
    """The worker and the submission server apply the cap to the job itself (a forged job included)."""
    job = plan(spec({**TOP_P, "samples": 8}))[0]
    assert job_refusal(job, None, Limits(max_samples=8)) is None
    why = job_refusal(job, None, Limits(max_samples=4))
    assert why == "refused: top_p samples=8 is over the limit of 4 (DECODEBENCH_MAX_SAMPLES)"


def test_a_strategy_spec_without_samples_serialises_as_before():
    assert StrategySpec(name="top_p", params={"p": 0.9}).model_dump() == {"name": "top_p", "params": {"p": 0.9}}
    assert StrategySpec(name="top_p", samples=2).model_dump() == {"name": "top_p", "params": {}, "samples": 2}


BAD = [
    ("{name: greedy, samples: 4}", "strategy 'greedy' is deterministic"),
    ("{name: beam, params: {num_beams: 2}, samples: 2}", "strategy 'beam' is deterministic"),
    ("{name: top_p, params: {p: 0.9}, samples: 0}", "samples: Input should be greater than or equal to 1"),
    ("{name: top_p, params: {p: 0.9}, samples: -3}", "samples: Input should be greater than or equal to 1"),
    ("{name: top_p, params: {p: 0.9}, samples: 2.5}", "samples: must be an integer, got float"),
    ("{name: top_p, params: {p: 0.9}, samples: 65}", "samples=65 is over the limit of 64 (DECODEBENCH_MAX_SAMPLES)"),
    ("{name: top_p, params: {p: 0.9}, samples: 1000000}", "samples: Input should be less than or equal to 65536"),
    ("{name: top_p, params: {p: 0.9}, best_of: model}", "best_of: strategy 'top_p' needs samples of at least 2"),
    ("{name: top_p, params: {p: 0.9}, samples: 4, best_of: scorer}", "best_of: scorer needs the sweep's `scorer`"),
    ("{name: top_p, params: {p: 0.9}, samples: 4, best_of: loudest}", "best_of: Input should be 'model' or 'scorer'"),
]


def sweep_file(tmp_path, entry: str):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"name: s\nmodels: [{{path: {TINY_MODEL}}}]\nprompts: {{inline: [a, b]}}\nstrategies:\n  - {entry}\n"
    )
    return path


@pytest.mark.parametrize("entry, expected", BAD)
def test_bad_samples_are_one_line_and_exit_2(tmp_path, entry, expected):
    path = sweep_file(tmp_path, entry)
    result = CliRunner().invoke(main, ["validate", str(path)], prog_name="decodebench")
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert expected in lines[0], lines[0]


def test_the_samples_cap_follows_the_setting(tmp_path, monkeypatch):
    path = sweep_file(tmp_path, "{name: top_p, params: {p: 0.9}, samples: 16}")
    assert CliRunner().invoke(main, ["validate", str(path)]).exit_code == 0
    monkeypatch.setenv("DECODEBENCH_MAX_SAMPLES", "8")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and "over the limit of 8 (DECODEBENCH_MAX_SAMPLES)" in result.stderr
