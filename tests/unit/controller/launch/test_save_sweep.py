"""spec.json as `run` and `submit` keep it: written once, but for the judge's limits, which the last run or
submission sets (they are not part of the sweep id)."""

from __future__ import annotations

import json

from controller.launch.local import save_sweep
from controller.sweep.load import parse_spec
from controller.sweep.plan import plan
from worker.core import paths
from worker.store import open_store

SPEC = {
    "name": "limits",
    "models": [{"path": "gpt2"}],
    "prompts": {"inline": ["a", "b"]},
    "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
}


def judged(max_requests: int):
    return parse_spec({**SPEC, "judge": {"url": "http://h/v1", "model": "m", "limits": {"max_requests": max_requests}}},
                      "sweep")  # fmt: skip


def test_an_older_spec_json_the_spec_alone_takes_raised_judge_limits(tmp_path):
    """An older spec.json is the spec alone, without the wrapper (the report reads both): run or submitted again
    with a raised limit, its limits stayed as they were, without a word, and the report stayed over budget."""
    store = open_store(str(tmp_path))
    first = judged(4)
    jobs = plan(first, "default")
    key = paths.spec_key("default", jobs[0].sweep_id)
    store.write_json(key, first.model_dump(mode="json"))  # as an older decodebench wrote it
    save_sweep(store, judged(6), jobs, "default", mode="distributed")
    stored = json.loads((tmp_path / key).read_text())
    assert stored["judge"]["limits"]["max_requests"] == 6
    assert "spec" not in stored and stored["strategies"] == first.model_dump(mode="json")["strategies"]
    assert store.load_spec("default", jobs[0].sweep_id)["judge"]["limits"]["max_requests"] == 6
