"""The engine's golden token ids: every decoding path on the bundled models, recorded once.

`python -m tests.unit.worker.engine.golden.record` writes `engine_tokens.json` beside it;
`tests/unit/worker/engine/test_golden.py` runs the same jobs and compares token for token, so that a
change of the engine's shape that changes an output is caught. Each case names a path: greedy and
seeded sampling (a stream with continuous refill and plain batches), penalties, stop strings,
contrastive search (the candidates over their row's cache with the SDPA mask; over a repeated cache
with eager attention), beam search and diverse beam search (the own loop's step; eager attention)
and batch_size 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.engine import job as engine_job
from tests.support.engine import with_generation
from tests.support.services import AUSTEN_PROMPTS, SMALL_MODEL, TINY_MODEL

GOLDEN = Path(__file__).with_name("engine_tokens.json")

# (name, strategy, params, settings, model options)
CASES: list[tuple[str, str, dict, dict, dict]] = [
    ("greedy-stream", "greedy", {}, {"batch_size": 3}, {}),
    ("greedy-batches", "greedy", {}, {"batch_size": 3, "refill": False}, {}),
    ("greedy-penalties", "greedy", {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}, {"batch_size": 4}, {}),
    ("greedy-stop", "greedy", {}, {"batch_size": 4, "stop": [".", ","]}, {}),
    ("greedy-min", "greedy", {}, {"batch_size": 4, "min_new_tokens": 12}, {}),
    ("top_p-stream", "top_p", {"p": 0.9}, {"batch_size": 3}, {}),
    ("top_p-batches", "top_p", {"p": 0.9, "temperature": 0.8}, {"batch_size": 4, "refill": False}, {}),
    ("top_k", "top_k", {"k": 20}, {"batch_size": 8}, {}),
    ("contrastive-stream", "contrastive", {"k": 4, "alpha": 0.6}, {"batch_size": 3}, {}),
    ("contrastive-batches", "contrastive", {"k": 3, "alpha": 0.4}, {"batch_size": 4, "refill": False}, {}),
    ("contrastive-eager", "contrastive", {"k": 4, "alpha": 0.6}, {"batch_size": 4}, {"attention": "eager"}),
    ("beam-stream", "beam", {"num_beams": 3}, {"batch_size": 3}, {}),
    ("beam-batches", "beam", {"num_beams": 4, "length_penalty": 0.8}, {"batch_size": 4, "refill": False}, {}),
    ("beam-early", "beam", {"num_beams": 3, "early_stopping": True}, {"batch_size": 4}, {}),
    ("beam-eager", "beam", {"num_beams": 3}, {"batch_size": 4}, {"attention": "eager"}),
    ("beam-stop", "beam", {"num_beams": 3}, {"batch_size": 4, "stop": ["."]}, {}),
    ("diverse-stream", "diverse_beam", {"num_beams": 4, "num_beam_groups": 2}, {"batch_size": 3}, {}),
    ("diverse-batches", "diverse_beam", {"num_beams": 6, "num_beam_groups": 3}, {"batch_size": 4, "refill": False}, {}),
    (
        "diverse-eager",
        "diverse_beam",
        {"num_beams": 4, "num_beam_groups": 2},
        {"batch_size": 4},
        {"attention": "eager"},
    ),
    ("greedy-one", "greedy", {}, {"batch_size": 1}, {}),
]
MODELS = {"austen-tiny": TINY_MODEL, "austen-small": SMALL_MODEL}
MAX_NEW = 24
SEED = 7


def job(model: Path, strategy: str, params: dict, settings: dict, model_options: dict):
    """The case's job: the bundled prompts, seed SEED, MAX_NEW tokens, the case's settings."""
    spec = engine_job(model, strategy, params, seed=SEED, max_new=MAX_NEW, prompts=AUSTEN_PROMPTS, **model_options)
    return with_generation(spec, **settings)


def run(runtime) -> dict[str, dict[str, list[list[int]]]]:
    """{model name: {case name: each prompt's token ids, in the shard's order}}."""
    from worker.engine.job import generate_job

    out: dict[str, dict[str, list[list[int]]]] = {}
    for name, path in MODELS.items():
        out[name] = {}
        for case, strategy, params, settings, options in CASES:
            _, records = generate_job(job(path, strategy, params, settings, options), runtime)
            out[name][case] = [r.token_ids for r in records]
    return out


if __name__ == "__main__":
    from worker.engine.job import Runtime

    GOLDEN.write_text(json.dumps(run(Runtime("cpu")), separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN}")
