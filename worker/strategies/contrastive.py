"""Contrastive search (Su et al. 2022, "A Contrastive Framework for Neural Text Generation").

At each step the k most likely tokens are candidates; each is scored

    (1 - alpha) * p(v | x_<t)  -  alpha * max_j cos(h_v, h_j)

where h_v is the candidate's last hidden state and h_j those of the context (padding
excluded), and the best candidate is kept. transformers 5 moved contrastive search out
of its core, so decodebench runs it itself (a step of the engine's decode loop): one forward pass of B*k candidate
tokens per step, as k tokens of their row over its own cache where the model takes the prepared mask, or
with the KV cache repeated k times and the winners' rows selected back, as the original implementation
does. alpha = 0 (or k = 1) is greedy search.

Registration is light: the engine's step is `worker.engine.loops.contrastive`.
"""

from __future__ import annotations

from worker.strategies.registry import Kind, Param, Strategy, register

register(
    Strategy(
        name="contrastive",
        description="contrastive search: model confidence minus a degeneration penalty",
        params={
            "k": Param(int, 4, "candidate tokens per step (top-k)", min=1),
            "alpha": Param(float, 0.6, "weight of the degeneration penalty", min=0.0, max=1.0),
        },
        stochastic=False,
        to_config=lambda p: {"do_sample": False, "num_beams": 1},
        kind=Kind.CONTRASTIVE,
        citation="Su et al. 2022",
    )
)
