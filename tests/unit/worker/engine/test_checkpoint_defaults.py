"""A checkpoint's own generation_config.json (top_k 20, min_p, typical_p, repetition_penalty 1.05 ... as chat
models ship them) never changes what a strategy variant computes: the variant's label says what runs."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.engine import job, texts
from tests.support.services import AUSTEN_PROMPTS

SHIPPED = {
    "do_sample": True,
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
    "min_p": 0.3,
    "typical_p": 0.5,
    "epsilon_cutoff": 0.01,
    "eta_cutoff": 0.01,
    "repetition_penalty": 1.5,
    "no_repeat_ngram_size": 2,
}


@pytest.fixture(scope="module")
def opinionated_model(tiny_model, tmp_path_factory):
    """The bundled tiny model, its generation_config.json setting every sampling and penalty default."""
    path = tmp_path_factory.mktemp("opinionated") / "austen-tiny"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **SHIPPED}))
    return str(path)


@pytest.mark.parametrize(
    ("strategy", "params"),
    [
        ("greedy", {}),
        ("beam", {"num_beams": 3}),
        ("top_k", {"k": 50}),
        ("top_p", {"p": 0.9}),
        ("min_p", {"p": 0.05}),
        ("sample", {}),
        ("greedy", {"repetition_penalty": 1.2}),
    ],
)
def test_a_checkpoints_defaults_do_not_leak_into_a_variant(tiny_model, opinionated_model, runtime, strategy, params):
    plain, _, _ = texts(runtime, job(tiny_model, strategy, params, seed=3, prompts=AUSTEN_PROMPTS[:4], max_new=12))
    shipped, _, result = texts(
        runtime, job(opinionated_model, strategy, params, seed=3, prompts=AUSTEN_PROMPTS[:4], max_new=12)
    )
    assert shipped == plain
    assert result.generation_config["repetition_penalty"] == params.get("repetition_penalty", 1.0)
    assert result.generation_config["no_repeat_ngram_size"] == 0


def test_a_plugins_sampling_config_gets_every_other_warper_off():
    """A plugin's to_config names what it samples with (docs/sweeps.md's example: top_k 0, top_p 1.0,
    temperature 1.0); the warpers it does not name are off too, not the checkpoint's."""
    from worker.strategies import Kind, Strategy
    from worker.strategies.registry import MODIFIERS_OFF, WARPERS_OFF

    plugin = Strategy(
        name="plugin",
        description="a custom sampler",
        params={},
        stochastic=True,
        to_config=lambda p: {"do_sample": True, "num_beams": 1, "top_k": 0, "top_p": 1.0, "temperature": 1.0},
        kind=Kind.CUSTOM,
        step="somewhere:Step",
    )
    assert plugin.generation_kwargs({}) == {"do_sample": True, "num_beams": 1, "temperature": 1.0,
                                            **WARPERS_OFF, **MODIFIERS_OFF}  # fmt: skip


PROCESSORS = {"min_length": 60, "suppress_tokens": [267], "begin_suppress_tokens": [12], "bad_words_ids": [[14]]}


@pytest.mark.parametrize(("strategy", "params"), [("greedy", {}), ("beam", {"num_beams": 3}), ("top_p", {"p": 0.9})])
def test_a_checkpoints_processors_do_not_leak_into_a_variant(tiny_model, runtime, tmp_path, strategy, params):
    """A generation_config.json with processors no strategy names (a BART-style min_length, Whisper-style
    suppress_tokens, bad words): generate() applied them (' the', ',' and '.' never written, EOS held back), where
    vLLM reads none of them and the variant's label says nothing of them."""
    path = tmp_path / "austen-tiny"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **PROCESSORS}))
    plain, _, _ = texts(runtime, job(tiny_model, strategy, params, seed=3, prompts=AUSTEN_PROMPTS[:4], max_new=12))
    shipped, _, result = texts(
        runtime, job(str(path), strategy, params, seed=3, prompts=AUSTEN_PROMPTS[:4], max_new=12)
    )
    assert shipped == plain
    assert [result.generation_config[key] for key in PROCESSORS] == [None] * len(PROCESSORS)
