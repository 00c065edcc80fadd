"""MAUVE (Pillutla et al. 2021): equal to mauve.compute_mauve on the same features, ~1 for identical
texts, ~0 for disjoint distributions; a local run with a featurizer stores features and reports MAUVE."""

from __future__ import annotations

import csv
import json

import mauve
import numpy as np
import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.metrics import METRICS, cell_data
from controller.metrics.divergence import MAUVE_SETTINGS
from controller.sweep.models import SweepSpec
from controller.sweep.plan import compute_sweep_id
from worker.core.contract import ModelSpec
from worker.engine.features import featurize

AUSTEN = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune must be in want",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite",
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never took up",
    "The family of Dashwood had long been settled in Sussex. Their estate was large, and their residence was",
    "No one who had ever seen Catherine Morland in her infancy would have supposed her born to be an heroine.",
]
NUMBERS = [" ".join(str((i * 7919 + k * 104729) % 100000) for k in range(24)) for i in range(5)]


def _texts(base: list[str], n: int) -> list[str]:
    return [f"{base[i % len(base)]} ({i})" for i in range(n)]


@pytest.fixture(scope="module")
def featurizer(small_model, runtime):
    return runtime.cache.get(ModelSpec(path=small_model), runtime.device)


def _cell(p: list[list[float]], q: list[list[float]]):
    return cell_data(
        {"text": "x", "reference": "y", "features": f, "reference_features": g} for f, g in zip(p, q, strict=True)
    )


def test_mauve_equals_compute_mauve_on_the_same_features():
    rng = np.random.default_rng(0)
    p, q = rng.normal(size=(30, 16)), rng.normal(0.5, 1.0, size=(30, 16))
    value = METRICS.get("mauve").fn(_cell(p.tolist(), q.tolist()))
    direct = mauve.compute_mauve(p_features=p.astype(np.float32), q_features=q.astype(np.float32), verbose=False)
    assert value == pytest.approx(direct.mauve, abs=1e-12)
    assert 0 < value < 1


def test_identical_texts_give_one_and_disjoint_distributions_near_zero(featurizer):
    austen = featurize(featurizer, _texts(AUSTEN, 30), 64, 8)
    numbers = featurize(featurizer, _texts(NUMBERS, 30), 64, 8)
    same = METRICS.get("mauve").fn(_cell(austen, austen))
    apart = METRICS.get("mauve").fn(_cell(austen, numbers))
    assert same == pytest.approx(1.0, abs=1e-6)
    assert apart < 0.1


def test_featurize_is_the_last_token_hidden_state_and_is_batch_independent(featurizer):
    import torch

    texts = _texts(AUSTEN, 5)
    batched, alone = featurize(featurizer, texts, 12, 5), featurize(featurizer, texts, 12, 1)
    ids = featurizer.tokenizer(texts[0])["input_ids"][:12]
    with torch.inference_mode():
        out = featurizer.model(torch.tensor([ids]), output_hidden_states=True)
    direct = out.hidden_states[-1][0, -1].float().tolist()
    assert np.allclose(alone[0], direct, atol=1e-5)
    assert np.allclose(batched, alone, atol=1e-4)


def test_mauve_is_empty_without_features_and_declares_what_it_needs():
    m = METRICS.get("mauve")
    assert m.needs_model and m.needs_references and m.interval == "none" and m.higher_is_better is True
    assert m.fn(cell_data([{"text": "a", "reference": "b"}] * 4)) is None
    partial = [{"text": "a", "reference": "b", "features": [1.0], "reference_features": [1.0]}, {"text": "a"}]
    assert m.fn(cell_data(partial)) is None
    for key, value in MAUVE_SETTINGS.items():
        assert f"{key}={value}" in m.description
    listed = CliRunner().invoke(main, ["metrics"])
    lines = listed.output.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("mauve "))
    entry = " ".join([lines[start], *(x.strip() for x in lines[start + 1 :] if x.startswith("    "))][:8])  # wrapped
    assert "needs references and model" in entry and "featurizer" in entry and "none interval" in entry


SPEC = """
name: mauve-e2e
models:
  - path: {model}
    name: tiny
featurizer:
  path: {model}
featurizer_max_tokens: 48
prompts:
  path: {prompts}
  limit: 20
  shard_size: 10
strategies:
  - name: greedy
generation:
  max_new_tokens: 8
  batch_size: 10
metrics: [mauve, distinct_2]
"""


def test_local_run_with_a_featurizer_stores_features_and_reports_mauve(tmp_path, tiny_model, prompts_file):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC.format(model=tiny_model, prompts=prompts_file))
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["--log-level", "warning", "run", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (sweep,) = (out / "default" / "sweeps").iterdir()
    jobs = list((sweep / "jobs").iterdir())
    gens = [json.loads(x) for job in jobs for x in (job / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 20 and all(len(g["features"]) == 128 == len(g["reference_features"]) for g in gens)
    provenance = json.loads((jobs[0] / "result.json").read_text())["provenance"]
    assert provenance["featurizer"]["max_tokens"] == 48
    rows = list(csv.DictReader((sweep / "report" / "summary.csv").open()))
    (row,) = [r for r in rows if r.get("strategy") == "greedy"]
    assert 0 < float(row["mauve"]) <= 1


def test_the_sweep_id_is_unchanged_without_a_featurizer(tiny_model):
    base = {
        "name": "n",
        "models": [{"path": tiny_model}],
        "prompts": {"inline": ["x"]},
        "strategies": [{"name": "greedy"}],
    }
    plain = SweepSpec.model_validate(base)
    explicit = SweepSpec.model_validate({**base, "featurizer": None, "featurizer_max_tokens": 1024})
    featurized = SweepSpec.model_validate({**base, "featurizer": {"path": tiny_model}})
    ids = [compute_sweep_id(s, "default", []) for s in (plain, explicit, featurized)]
    assert ids[0] == ids[1] != ids[2]


def test_cells_compare_on_equal_samples_and_each_reference_counts_once():
    """Greedy (one seed) and top_p (two seeds) are compared on as many generations, seed recorded."""
    from controller.report.compute.aggregate import summarize
    from tests.support.report import make_sweep

    data = make_sweep(seeds=(0, 1), n_prompts=24)
    rng = np.random.default_rng(3)
    refs = {p.id: rng.normal(0.3, 1.0, 8).tolist() for p in data.prompts}
    for g in data.generations:
        g.features = rng.normal(size=8).tolist()
        g.reference_features = refs[g.prompt_id]
    summary = summarize(data, n_boot=0)
    cells = summary[summary["strategy"] != "reference"].set_index("strategy")
    assert list(cells["n_generations"]) == [24, 48]
    assert list(cells["mauve_n"]) == [24, 24] and list(cells["mauve_n_references"]) == [24, 24]
    assert list(cells["mauve_clusters"]) == [2, 2]  # max(2, round(24 / 10))
    assert summary.attrs["mauve"]["n"] == 24
    # top_p's value: mauve on 24 of its 48 generations drawn as recorded, against the 24 references once each
    from controller.report.compute.cells import mauve_seed

    top = sorted((g for g in data.generations if g.strategy == "top_p"), key=lambda g: (g.prompt_id, g.job_seed))
    chosen = sorted(np.random.default_rng(mauve_seed(0, top[0].cell)).choice(48, 24, replace=False).tolist())
    p = np.array([top[i].features for i in chosen], dtype=np.float32)
    q = np.array([refs[pid] for pid in sorted(refs)], dtype=np.float32)
    direct = mauve.compute_mauve(p_features=p, q_features=q, verbose=False, **MAUVE_SETTINGS).mauve
    assert cells.loc["top_p", "mauve"] == pytest.approx(direct, abs=1e-12)
