"""The plain strategies: each is a table row of transformers GenerationConfig settings.

Sampling rows reset every warper (`top_k`, `top_p`, `min_p`, `typical_p`, `epsilon_cutoff`, `eta_cutoff`)
explicitly (`registry.WARPERS_OFF`) so that a checkpoint's own generation_config defaults (many ship top_k=50, some
min_p or typical_p) never leak into another strategy; `registry.Strategy.generation_kwargs` resets the modifiers the
same way, and the warpers of a plugin's sampling config.
"""

from __future__ import annotations

from worker.strategies.registry import MIN_DIVISOR, WARPERS_OFF, Kind, Param, Strategy, register

TEMPERATURE = Param(float, 1.0, "softmax temperature (towards 0: use greedy)", min=MIN_DIVISOR)
SAMPLE_BASE = {"do_sample": True, "num_beams": 1, **WARPERS_OFF}


def _sampling(**extra):
    def to_config(p):
        cfg = {**SAMPLE_BASE, "temperature": p["temperature"]}
        cfg.update({key: p[src] for key, src in extra.items()})
        return cfg

    return to_config


register(
    Strategy(
        name="greedy",
        description="argmax at every step",
        params={},
        stochastic=False,
        to_config=lambda p: {"do_sample": False, "num_beams": 1},
    )
)

register(
    Strategy(
        name="beam",
        description="beam search",
        params={
            "num_beams": Param(int, 4, "beams kept at each step", min=2),
            "length_penalty": Param(float, 1.0, "exponent on length in the beam score (>0 favours longer)"),
            "early_stopping": Param(bool, False, "stop when num_beams finished candidates exist"),
        },
        stochastic=False,
        kind=Kind.BEAM,
        to_config=lambda p: {
            "do_sample": False,
            "num_beams": p["num_beams"],
            "length_penalty": p["length_penalty"],
            "early_stopping": p["early_stopping"],
        },
    )
)

register(
    Strategy(
        name="sample",
        description="ancestral sampling from the full (temperature-scaled) distribution",
        params={"temperature": TEMPERATURE},
        stochastic=True,
        to_config=_sampling(),
    )
)

register(
    Strategy(
        name="top_k",
        description="sample from the k most likely tokens",
        params={"k": Param(int, 50, "tokens kept", min=1), "temperature": TEMPERATURE},
        stochastic=True,
        to_config=_sampling(top_k="k"),
        citation="Fan et al. 2018",
    )
)

register(
    Strategy(
        name="top_p",
        description="nucleus sampling: the smallest set of tokens with probability mass >= p",
        params={
            "p": Param(float, 0.9, "probability mass kept", min=0.0, max=1.0, min_exclusive=True),
            "temperature": TEMPERATURE,
        },
        stochastic=True,
        to_config=_sampling(top_p="p"),
        citation="Holtzman et al. 2020",
    )
)

register(
    Strategy(
        name="typical",
        description="locally typical sampling",
        params={
            "mass": Param(float, 0.95, "typical probability mass kept", min=0.0, max=1.0, min_exclusive=True),
            "temperature": TEMPERATURE,
        },
        stochastic=True,
        to_config=_sampling(typical_p="mass"),
        citation="Meister et al. 2023",
    )
)

register(
    Strategy(
        name="min_p",
        description="keep tokens with probability >= p x the top token's",
        params={
            "p": Param(float, 0.1, "scale of the top probability", min=0.0, max=1.0, min_exclusive=True),
            "temperature": TEMPERATURE,
        },
        stochastic=True,
        to_config=_sampling(min_p="p"),
        citation="Nguyen et al. 2024",
    )
)

register(
    Strategy(
        name="epsilon",
        description="truncation sampling: drop tokens with probability < epsilon",
        params={
            "epsilon": Param(
                float, 3e-4, "absolute probability cutoff", min=0.0, max=1.0, min_exclusive=True, max_exclusive=True
            ),
            "temperature": TEMPERATURE,
        },
        stochastic=True,
        to_config=_sampling(epsilon_cutoff="epsilon"),
        citation="Hewitt et al. 2022",
    )
)

register(
    Strategy(
        name="eta",
        description="entropy-dependent truncation sampling",
        params={
            "eta": Param(
                float,
                3e-4,
                "cutoff scale (min of eta and sqrt(eta) * exp(-entropy))",
                min=0.0,
                max=1.0,
                min_exclusive=True,
                max_exclusive=True,
            ),
            "temperature": TEMPERATURE,
        },
        stochastic=True,
        to_config=_sampling(eta_cutoff="eta"),
        citation="Hewitt et al. 2022",
    )
)
