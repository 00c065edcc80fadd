"""Planning: deterministic content-hash ids, grid expansion, seeds and sharding."""

from __future__ import annotations

import pytest

from controller.sweep.load import parse_spec
from controller.sweep.plan import expand_grid, plan, summarize_plan
from tests.support.repo import REPO

pytestmark = pytest.mark.pure


def spec(**over):
    data = {
        "name": "p",
        "models": [{"path": "org/model-a"}, {"path": "org/model-b", "name": "b"}],
        "prompts": {"inline": [f"prompt {i}" for i in range(10)], "shard_size": 4},
        "strategies": [
            {"name": "greedy"},
            {"name": "top_p", "params": {"p": [0.8, 0.9], "temperature": [0.7, 1.0]}},
            {"name": "beam", "params": {"num_beams": 2}},
        ],
        "generation": {"seeds": [1, 2, 3], "max_new_tokens": 16},
    }
    data.update(over)
    return parse_spec(data)


def test_same_spec_same_ids():
    a, b = plan(spec()), plan(spec())
    assert [j.job_id for j in a] == [j.job_id for j in b]
    assert len({j.job_id for j in a}) == len(a)
    assert a[0].sweep_id == b[0].sweep_id


def test_ids_change_with_content_and_tenant():
    base = plan(spec())[0].sweep_id
    assert plan(spec(), tenant="team-a")[0].sweep_id != base
    other = spec(prompts={"inline": [f"prompt {i}!" for i in range(10)], "shard_size": 4})
    assert plan(other)[0].sweep_id != base
    assert plan(spec(description="words only"))[0].sweep_id == base


def test_grid_seeds_and_shards():
    jobs = plan(spec())
    s = summarize_plan(jobs)
    # cells: 2 models x (greedy + 4 top_p variants + beam) = 12
    assert s.cells == 12
    # shards: ceil(10 / 4) = 3; seeds: 3 for the 4 stochastic variants, 1 for greedy and beam
    assert s.jobs == 2 * (1 + 4 * 3 + 1) * 3
    assert s.generations == 2 * (1 + 4 * 3 + 1) * 10
    assert s.tokens_to_generate == s.generations * 16
    greedy = [j for j in jobs if j.strategy.name == "greedy"]
    assert {j.seed for j in greedy} == {1}
    assert sorted(len(j.prompts) for j in greedy[:3]) == [2, 4, 4]


def test_grouped_by_model_and_defaults_filled():
    jobs = plan(spec())
    models = [j.model.label for j in jobs]
    assert models == sorted(models, key=lambda m: models.index(m))  # contiguous groups
    assert models.index("b") == len(jobs) // 2
    beam = next(j for j in jobs if j.strategy.name == "beam")
    assert beam.strategy.params == {"num_beams": 2, "length_penalty": 1.0, "early_stopping": False}


def test_expand_grid_is_sorted_product():
    assert expand_grid({"b": [1, 2], "a": 0}) == [{"a": 0, "b": 1}, {"a": 0, "b": 2}]
    assert expand_grid({}) == [{}]


def test_duplicate_variants_are_planned_once_and_named(tmp_path):
    """A variant listed twice was merged into one cell without a word (a copy-pasted entry whose parameter the user
    forgot to change looked like a sweep of two); now each repeat is named, and `validate`, `run` and `submit`
    print it."""
    from click.testing import CliRunner

    from controller.cli import main
    from controller.sweep.plan import repeated_variants

    entries = [{"name": "top_k", "params": {"k": [5, 5]}}, {"name": "top_k", "params": {"k": 5, "temperature": 1.0}}]
    s = spec(strategies=[{"name": "greedy"}, *entries])
    assert summarize_plan(plan(s)).cells == 2 * 2
    assert repeated_variants(s) == [
        "strategies[1]: top_k(k=5,temperature=1.0) repeats an earlier value of its own grid (with defaults filled in): "
        "planned once",
        "strategies[2]: top_k(k=5,temperature=1.0) repeats strategies[1] (with defaults filled in): planned once",
    ]
    assert repeated_variants(spec()) == []
    (tmp_path / "s.yaml").write_text(
        "name: s\nmodels: [{path: org/m}]\nprompts: {inline: [hi]}\nstrategies: [{name: greedy}, {name: greedy}]\n"
    )
    out = CliRunner().invoke(main, ["validate", str(tmp_path / "s.yaml")])
    assert out.exit_code == 0 and "1 cell," in out.stdout
    assert "note: strategies[1]: greedy repeats strategies[0] (with defaults filled in): planned once" in out.stderr
    out = CliRunner().invoke(main, ["validate", str(REPO / "examples" / "quickstart.yaml")])
    assert out.exit_code == 0 and "note:" not in out.stderr  # the quickstart repeats nothing


def test_the_same_sweep_in_two_checkouts_has_one_id(tmp_path):
    import shutil

    from controller.sweep.load import load_spec

    ids = []
    for place in ("a", "b/deeper"):
        root = tmp_path / place
        (root / "models" / "m").mkdir(parents=True)
        (root / "models" / "draft").mkdir()
        for model in ("m", "draft"):  # a local model is a directory with a config.json
            (root / "models" / model / "config.json").write_text("{}")
        (root / "sweep.yaml").write_text(
            "name: s\nmodels: [{path: models/m}]\nprompts: {inline: [hi]}\n"
            "strategies: [{name: greedy}, {name: assisted, params: {assistant: models/draft}}]\n"
        )
        ids.append(plan(load_spec(root / "sweep.yaml"))[0].sweep_id)
        assert plan(load_spec(root / "sweep.yaml"))[0].model.path == str((root / "models" / "m").resolve())
    assert ids[0] == ids[1]
    shutil.move(str(tmp_path / "a" / "models" / "m"), str(tmp_path / "a" / "models" / "m2"))
    (tmp_path / "a" / "sweep.yaml").write_text(
        (tmp_path / "a" / "sweep.yaml").read_text().replace("models/m}", "models/m2}")
    )
    assert plan(load_spec(tmp_path / "a" / "sweep.yaml"))[0].sweep_id != ids[0]


def test_the_quickstart_keeps_its_sweep_id_as_settings_are_added():
    """Settings added after sweeps existed (attention, static_cache, refill, decode_step, featurizer...) count only
    when set: the quickstart's id is the one it had before them, and setting one changes it."""
    from controller.sweep.load import load_spec

    quickstart = REPO / "examples" / "quickstart.yaml"
    spec = load_spec(quickstart)
    assert plan(spec)[0].sweep_id == "cb3dce6badd617dc"
    batches = spec.model_copy(update={"generation": spec.generation.model_copy(update={"refill": False})})
    assert plan(batches)[0].sweep_id != "cb3dce6badd617dc"
    graphed = spec.model_copy(update={"generation": spec.generation.model_copy(update={"decode_step": "graphs"})})
    assert plan(graphed)[0].sweep_id != "cb3dce6badd617dc"


def test_the_planner_writes_what_the_metrics_need_the_worker_to_compute_and_ids_stay():
    """A job says what its worker computes (score, featurize), from the metric registry; ids are unchanged
    (the quickstart's pinned sweep id: test_the_quickstart_keeps_its_sweep_id_as_settings_are_added)."""
    everything = plan(spec())
    assert {tuple(j.compute) for j in everything} == {("featurize", "score")}  # no metrics listed: all of them
    assert plan(spec(metrics=["distinct_1", "rep_2"]))[0].compute == []
    assert plan(spec(metrics=["coherence", "distinct_1"]))[0].compute == ["score"]
    referenced = {"inline": [{"id": f"p{i}", "prompt": f"prompt {i}", "reference": "r"} for i in range(10)]}
    mauve = spec(metrics=["mauve"], featurizer={"path": "org/featurizer"}, prompts=referenced)
    assert plan(mauve)[0].compute == ["featurize"]
    assert [j.job_id for j in everything] == [j.job_id for j in plan(spec())]  # ids hash coordinates, not compute


@pytest.mark.parametrize(
    "over",
    [{}, {"strategies": [{"name": "top_k", "params": {"k": [5, 5]}}, {"name": "top_k", "params": {"k": 5}}]}],
    ids=["grid", "duplicates"],
)
def test_planned_size_counts_the_jobs_and_bounds_their_payloads_from_below(over):
    """What the server refuses an over-quota sweep from, before planning (issue 39): the exact job count, and
    never more payload than the jobs serialise to (so a sweep within the quota is never refused by it)."""
    from controller.sweep.plan import planned_size
    from controller.sweep.prompts import load_prompts

    s = spec(**over)
    n_jobs, min_chars = planned_size(s, load_prompts(s.prompts))
    jobs = plan(s)
    assert n_jobs == len(jobs)
    assert 0 < min_chars <= sum(len(j.model_dump_json()) for j in jobs)
