"""Diverse (group) beam search (Vijayakumar et al. 2018, "Diverse Beam Search").

The num_beams beams of a prompt are split into num_beam_groups groups of K beams.
At every step the groups are extended in turn; group g runs one step of ordinary beam
search over its K beams, on log-probabilities minus a Hamming diversity term:

    log p(v | beam) - diversity_penalty * #{beams of groups < g that chose v at this step}

so each group is pushed away from the tokens the earlier groups just picked. Group 0 is
never penalised: it is plain beam search with K beams. As in transformers 4.x, the
penalised scores are what accumulate into a beam's score.

Within a group the bookkeeping is transformers 5 `_beam_search`'s (early_stopping=False):
of the group's 2K best continuations, those among the top K that end (EOS, a stopping
criterion, or the length limit) become finished hypotheses scored
sum / new_len ** length_penalty, of which the group keeps its K best, and the K best
that do not stop run on. A group stops improving once its K finished hypotheses cannot
be beaten by its best running beam (`stopping`: best_running, the default; best_candidate:
by the best of its candidates at the step, ending ones included, as transformers 4.x's group
beam search checked it); from then on it no longer steers the later groups.
The answer is the best finished hypothesis over all groups. With one group this is
exactly transformers' beam search (a test checks it token for token).

transformers 5 moved group beam search out of its core, so decodebench runs it itself: one
forward pass per step of the num_beams rows of every prompt still searched over one KV
cache, whose rows are reordered to the surviving beams' parents (a prompt whose groups can
no longer improve leaves the pass); a model whose cache cannot be reordered so is refused.
Registration is light: the engine's step is `worker.engine.loops.beam_step`.
"""

from __future__ import annotations

from typing import Any

from worker.strategies.registry import Kind, Param, Strategy, register

STOPPING = ("best_running", "best_candidate")  # what a group's worst hypothesis must beat (`stopping`)


def check_groups(num_beams: int, num_beam_groups: int) -> None:
    if num_beams % num_beam_groups:
        raise ValueError(f"num_beams ({num_beams}) must be divisible by num_beam_groups ({num_beam_groups})")


class _DiverseBeam(Strategy):
    """Adds the one check that spans two parameters; the sweep spec applies it to every grid point."""

    def check_together(self, params: dict[str, Any]) -> None:
        check_groups(params["num_beams"], params["num_beam_groups"])


register(
    _DiverseBeam(
        name="diverse_beam",
        description="diverse (group) beam search: beam groups penalised for picking the same tokens",
        params={
            "num_beams": Param(int, 4, "beams kept at each step, over all groups", min=2),
            "num_beam_groups": Param(int, 2, "groups the beams are split into (must divide num_beams)", min=1),
            "diversity_penalty": Param(
                float, 0.5, "subtracted per beam of an earlier group that chose the same token at this step", min=0.0
            ),
            "length_penalty": Param(
                float, 1.0, "exponent on length in the finished-hypothesis score (>0 favours longer)"
            ),
            "stopping": Param(
                str,
                None,
                "when a group stops: once its K hypotheses cannot be beaten by its best running beam"
                " (unset or best_running: transformers 5's rule) or by the best of its candidates at the step"
                " (best_candidate: transformers 4.x's group beam search)",
                optional=True,
                choices=STOPPING,
            ),
        },
        stochastic=False,
        # num_beams > 1 makes the engine treat it like beam search (no per-row finish recorder).
        # num_beam_groups stays out of the GenerationConfig: transformers 5 would route it to the hub.
        to_config=lambda p: {
            "do_sample": False,
            "num_beams": p["num_beams"],
            "length_penalty": p["length_penalty"],
            "early_stopping": False,
        },
        kind=Kind.DIVERSE_BEAM,
        citation="Vijayakumar et al. 2018",
    )
)
