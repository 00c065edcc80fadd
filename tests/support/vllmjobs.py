"""The vLLM tests' jobs (tests/vllm: the engine's and the parity tests): the engine's settings on the CPU, the
held-out prompts and `jobs_of`, which plans a sweep of austen-tiny on vLLM. Imports no vLLM."""

from __future__ import annotations

import json

from controller.sweep.load import parse_spec
from controller.sweep.plan import plan
from tests.support.services import PROMPTS, TINY_MODEL

ENGINE = {"name": "vllm", "dtype": "float32", "max_model_len": 256, "kv_cache_space_gb": 1, "max_num_seqs": 16}
HELD_OUT = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:16]]


def jobs_of(strategies, prompts=HELD_OUT, engines=(ENGINE,), scorer=None, **generation):
    """The jobs of a sweep of austen-tiny with these strategies on `engines` (vLLM), max 32 new tokens, no warm-up."""
    data = {
        **({"scorer": {"path": scorer}} if scorer else {}),
        "name": "vllm-test",
        "models": [{"path": str(TINY_MODEL)}],
        "prompts": {"inline": prompts, "shard_size": 64},
        "strategies": strategies,
        "generation": {"max_new_tokens": 32, "warmup": False, **generation},
        "engines": list(engines),
    }
    return plan(parse_spec(data))
