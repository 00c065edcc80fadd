"""Mirostat's step of decodebench's decode loop (Basu et al. 2021, Algorithm 1; the authors' code,
github.com/basusourya/mirostat, for the details the paper leaves open).

Each generation keeps its maximum surprise mu, starting at 2 * tau. At every step, over the
distribution p sorted in descending order (N tokens):

1. the Zipf exponent, by least squares over the m most likely tokens:
   s = sum_i t_i b_i / sum_i t_i^2, t_i = log((i + 1) / i), b_i = log(p_i / p_(i+1)), i = 1..m (as the
   authors' code sums; the paper writes the sum to m - 1);
2. k = ((eps * 2^mu) / (1 - N^-eps))^(1 / s) with eps = s - 1, rounded, plus one;
3. the token X is drawn from the k most likely tokens (renormalised);
4. its surprise S(X) = -log2 p(X), under the whole distribution, corrects mu: mu -= eta * (S(X) - tau).

The draw is the engine's seeded one (`TokenStep.draw`), so a generation depends on its seed and
prompt only; mu is kept per generation, indexed by its place in the job's queue (`rows.live`), so
compaction and continuous refill move nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from worker.engine.custom import TokenStep

FLOOR = -700.0  # the log-probability a token excluded by a processor (-inf) counts as in the estimate of s


def zipf_exponent(sorted_logp: torch.Tensor, m: int) -> torch.Tensor:
    """Per row, the least-squares Zipf exponent s of the m most likely tokens (log-probabilities sorted
    in descending order, (rows, N)); float64."""
    m = min(m, sorted_logp.shape[-1] - 1)
    i = torch.arange(1, m + 1, dtype=torch.float64, device=sorted_logp.device)
    t = torch.log((i + 1) / i)
    lp = sorted_logp[:, : m + 1].double().clamp(min=FLOOR)
    b = lp[:, :-1] - lp[:, 1:]
    return (b * t).sum(-1) / (t * t).sum()


def mirostat_k(s: torch.Tensor, mu: torch.Tensor, n: int) -> torch.Tensor:
    """Per row, the number of most likely tokens kept: round(((eps 2^mu) / (1 - n^-eps))^(1/s)) + 1,
    eps = s - 1 (its limit 1 / ln n at eps = 0), within [1, n]."""
    eps = s - 1
    small = eps.abs() < 1e-12
    ratio = torch.where(small, 1 / math.log(n), eps / (1 - n ** (-torch.where(small, 1.0, eps))))
    k = (ratio * 2.0**mu) ** (1 / s)
    k = torch.nan_to_num(torch.round(k), nan=n, posinf=n, neginf=1) + 1
    return k.clamp(1, n).long()


@dataclass
class MirostatStep(TokenStep):
    """Mirostat (v1) per row, over the decode loop's rows."""

    tau: float = 3.0
    eta: float = 0.1
    m: int = 100
    mu: torch.Tensor | None = None  # per generation (queue row): its maximum surprise

    @classmethod
    def options(cls, params: dict[str, Any]) -> dict[str, Any]:
        return {"tau": float(params["tau"]), "eta": float(params["eta"]), "m": int(params["m"])}

    def choose(self, scores: torch.Tensor, rows) -> torch.Tensor:
        if self.mu is None:
            self.mu = torch.full((self.total,), 2 * self.tau, dtype=torch.float64, device=scores.device)
        mu = self.mu[rows.live]
        logp = torch.log_softmax(scores.double(), dim=-1)
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        k = mirostat_k(zipf_exponent(sorted_logp, self.m), mu, scores.shape[-1])
        rank = torch.arange(scores.shape[-1], device=scores.device)
        kept = torch.empty_like(rank.expand_as(order), dtype=torch.bool).scatter_(1, order, rank < k[:, None])
        nxt = self.draw(scores.masked_fill(~kept, -math.inf), rows)
        surprise = -logp.gather(1, nxt[:, None]).squeeze(1) / math.log(2)
        self.mu[rows.live] = mu - self.eta * (surprise - self.tau)
        return nxt
