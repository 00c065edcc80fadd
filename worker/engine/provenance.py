"""result.json's `provenance`, for both engines: versions, host, image, pod and node, device, models, seeding, and
a plugin strategy's entry point, distribution and version (`strategy_plugin`).

`provenance(job, runtime, models, engine)`: the image, pod and node are the runtime's settings (given at
the edge: worker.engine.job.EngineSettings, from the settings table), the device its device info;
`models` the model's info (and the scorer's and featurizer's); `engine` what an engine other than the
own one adds or says otherwise (vLLM: its name and version, how its seeds reach it). Light: torch is
the only library it imports at the top, so that vLLM's environment imports it as the own engine does.
"""

from __future__ import annotations

import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

import torch

import worker
from worker.core.contract import JobSpec
from worker.strategies import get_strategy

SEEDING = "each generation's seed = sha256(job seed, prompt id); see worker.engine.sampling"
SAMPLE_SEEDING = "sample 0: the generation's seed; sample i >= 1: sha256 of JSON [job seed, prompt id, i]"


def provenance(
    job: JobSpec, runtime: Any, models: Mapping[str, Any], engine: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """result.json's provenance. `runtime`: the worker's (worker.engine.job.Runtime: its settings and device
    info); `models`: {"model": ..., and where the job has them "scorer", "featurizer", "assistant"}; `engine`: an
    engine's own entries, which take the place of the own engine's (its seeding)."""
    import transformers

    samples = {}
    if job.strategy.samples is not None:
        samples = {"samples": job.strategy.samples, "best_of": job.strategy.best_of, "sample_seeding": SAMPLE_SEEDING}
    plugin = get_strategy(job.strategy.name).plugin  # what a resumed sweep and a report compare (results.plugin_of)
    return {
        "decodebench": worker.__version__,
        "host": socket.gethostname(),
        "image": runtime.settings.image,
        "pod": runtime.settings.pod,
        "node": runtime.settings.node,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": runtime.device_info,
        **models,
        "seed": job.seed,
        "seeding": SEEDING,
        **samples,
        **({"strategy_plugin": plugin} if plugin else {}),
        **(engine or {}),
    }
