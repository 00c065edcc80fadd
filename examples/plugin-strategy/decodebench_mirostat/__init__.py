"""Mirostat (Basu, Ramachandran, Keskar, Varshney 2021, "Mirostat: A Neural Text Decoding Algorithm
that Directly Controls Perplexity", ICLR; Algorithm 1) as a decodebench strategy plugin.

This module is the declaration decodebench reads through the entry point `decodebench.strategies`:
light (no torch), so `decodebench strategies` and `validate` can list and check it. The step that
decodes it, `decodebench_mirostat.step.MirostatStep`, is imported by the engine only.
"""

from worker.strategies import Kind, Param, Strategy

STRATEGY = Strategy(
    name="mirostat",
    description="Mirostat: top-k sampling, k set each step so that the surprise tracks a target (perplexity control)",
    params={
        "tau": Param(
            float, 3.0, "target surprise in bits (cross-entropy the text keeps to)", min=0.0, min_exclusive=True
        ),
        "eta": Param(float, 0.1, "learning rate of the maximum surprise mu", min=0.0, min_exclusive=True, max=1.0),
        "m": Param(int, 100, "most likely tokens the Zipf exponent is estimated from", min=2, max=100_000),
    },
    stochastic=True,
    # a sampling config without warpers: the engine's seeded sampler draws, MirostatStep.choose sets k
    to_config=lambda p: {"do_sample": True, "num_beams": 1, "top_k": 0, "top_p": 1.0, "temperature": 1.0},
    kind=Kind.CUSTOM,
    step="decodebench_mirostat.step:MirostatStep",
    citation="Basu et al. 2021",
)
