"""`batch_size: auto` per length bucket: on CUDA a job whose shorter prompts fit clearly more rows than its
longest runs in groups, each at its own size (worker.engine.batching.length_groups).

The rule is tested on its own, the plan of a real job through a CUDA runtime whose fit probe is faked
(tests.support.engine.CudaProbe: no GPU here), and the generations of a job run in groups on the CPU:
token for token those of the same job in one group, greedy and seeded sampling, streams and batches.
"""

from __future__ import annotations

import pytest

from tests.support.engine import MIXED, CudaProbe, job, with_generation
from worker.core.contract import ModelSpec
from worker.engine import batching
from worker.engine import job as job_module
from worker.engine.job import generate_job
from worker.engine.plan import configure


def sized(fits: dict[int, int]):
    """A size_for that says fits[bucket of the longest] rows fit (at most the prompts left), and records
    how many prompts each call was asked about."""

    def size_for(lengths: list[int]) -> int:
        size_for.asked.append(len(lengths))
        return min(len(lengths), fits[batching.length_bucket(max(lengths))])

    size_for.asked = []
    return size_for


def test_a_bucket_starts_a_group_only_where_its_larger_size_saves_a_generations_steps():
    # 2 long prompts, 100 short ones: the short fit 100 rows, the long 20; 100 x (1/20 - 1/100) = 4 >= 1
    lengths = [200, *[20] * 50, 210, *[20] * 50]
    size_for = sized({256: 20, 32: 128})
    groups = batching.length_groups(lengths, size_for)
    assert [(size, len(ix)) for size, ix in groups] == [(20, 2), (100, 100)]
    assert groups[0][1] == [51, 0] and groups[1][1] == [i for i in range(102) if i not in (0, 51)]
    assert size_for.asked == [102, 100]
    # the boundary: 40 short prompts at 40 rows instead of 20 save 40 x (1/20 - 1/40) = 1 generation's steps,
    # 39 at 39 rows save 0.95
    for short, split in ((40, True), (39, False)):
        groups = batching.length_groups([200] * 30 + [20] * short, sized({256: 20, 32: 100}))
        assert len(groups) == (2 if split else 1) and sum(len(ix) for _, ix in groups) == 30 + short
    # shorter prompts that fit no more rows join the group before them
    assert [len(ix) for _, ix in batching.length_groups([200] * 30 + [20] * 60, sized({256: 20, 32: 20}))] == [90]


def test_prompts_that_the_current_size_holds_are_not_probed():
    # 50 long prompts at 20 rows, then 10 short ones: 10 <= 20, no size saves a generation, no probe
    size_for = sized({256: 20, 32: 128})
    groups = batching.length_groups([200] * 50 + [20] * 10, size_for)
    assert [(size, len(ix)) for size, ix in groups] == [(20, 60)] and size_for.asked == [60]
    # one bucket: one group, one probe
    size_for = sized({32: 8})
    assert batching.length_groups([20, 18, 30], size_for) == [(3, [2, 0, 1])] and size_for.asked == [3]


def test_a_cuda_job_with_long_prompts_runs_its_short_ones_at_their_own_size(tiny_model, runtime, monkeypatch):
    """MIXED's two longest prompts (17-32 tokens) fit 2 rows of a stream's buffers, the rest 8: the plan
    has two groups, each probed once (the third and fourth buckets join the second unprobed), and
    the record says so."""
    cuda = CudaProbe(runtime, monkeypatch, fit=lambda length, cap: min(cap, 2 if length >= 32 + 64 else 8))
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    spec = with_generation(job(tiny_model, "greedy", max_new=40, prompts=MIXED), batch_size="auto")
    decoding = configure(lm, spec.strategy, spec.generation)
    groups, scorer_size, info = cuda.plan(lm, decoding, spec)
    assert [(size, [len(b) for b in batches]) for size, batches in groups] == [(2, [2]), (7, [7])]
    assert [p.prompt for p in groups[0][1][0]] == [MIXED[1], MIXED[8]]  # the longest, longest first
    assert scorer_size == 2 and info["used"] == 7
    assert info["groups"] == [
        {"batch_size": 2, "prompts": 2, "longest": 25},
        {"batch_size": 7, "prompts": 7, "longest": 8},
    ]
    assert [b["longest"] for b in info["buckets"]] == [25, 8]
    # a stream's buffers: the bucket + max_new + 8 steps between checks + the reserve max(16, 40 // 4)
    assert cuda.asked == [(32 + 64, 1), (8 + 64, 1)]
    # prompts of one length bucket: one group, one probe, no groups in the record
    spec = with_generation(job(tiny_model, "greedy", max_new=40, prompts=MIXED[3:7]), batch_size="auto")
    groups, _, info = CudaProbe(runtime, monkeypatch).plan(lm, decoding, spec)
    assert len(groups) == 1 and "groups" not in info and "buckets" not in info


@pytest.mark.parametrize("refill", [True, False])
@pytest.mark.parametrize("strategy, params", [("greedy", {}), ("top_p", {"p": 0.9})])
def test_a_job_run_in_groups_generates_what_it_does_in_one(tiny_model, runtime, monkeypatch, strategy, params, refill):
    """The same job in one group of 3 rows and in two groups (its 3 longest prompts at 2 rows, the rest at 3):
    every generation is the same tokens (greedy; sampling with each generation's own seed), and each
    group of more than one batch ran as one stream of its size."""
    spec = job(tiny_model, strategy, params, batch_size=3, max_new=12, prompts=MIXED)
    spec = with_generation(spec, refill=refill)
    _, one = generate_job(spec, runtime)

    def two_groups(runtime, lm, decoding, job, lengths):
        order = batching.longest_first(lengths)
        return [(2, order[:3]), (3, order[3:])], {"auto": {}, "used": 3}

    monkeypatch.setattr(job_module, "auto_groups", two_groups)
    result, grouped = generate_job(with_generation(spec, batch_size="auto"), runtime)
    assert [r.token_ids for r in grouped] == [r.token_ids for r in one]
    assert [r.prompt_id for r in grouped] == [r.prompt_id for r in one]
    assert [r.stop_reason for r in grouped] == [r.stop_reason for r in one]
    sizes = [b.batch_size for b in result.batches]
    assert sizes == ([2, 3] if refill else [2, 1, 3, 3]) and sum(b.n for b in result.batches) == len(MIXED)
