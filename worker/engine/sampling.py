"""Sampling: each generation's own seed, transformers' warpers, and the seeded sampler.

Sampling strategies do not use transformers' batch-wide RNG. The engine applies
transformers' own warpers (temperature, top-k, top-p, min-p, typical, epsilon, eta, in
transformers' order) and then draws each row's token by inverse-CDF sampling with a
uniform from a counter-based generator keyed by (that generation's own seed, step),
computed for the whole batch at once. A generation's text therefore depends on its seed and
prompt, not on which prompts share its batch (up to the floating-point effects of
padding, which on GPU can flip a rare near-tie).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch
from transformers import LogitsProcessor
from transformers.generation import logits_process as lp

SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def generation_seed(job_seed: int, prompt_id: str, sample: int = 0) -> int:
    """Each generation's own seed (63-bit): a hash of the job seed and the prompt id; a prompt's later samples
    (`sample` >= 1, a variant's `samples`) hash the sample too. Sample 0 keeps the seed a generation has always
    had, so a job's sample 0 is the generation of the same job without samples; the JSON text of a later
    sample's key starts with "[", which no "<job seed>:<prompt id>" text does, so no two keys collide."""
    key = f"{job_seed}:{prompt_id}" if sample == 0 else json.dumps([job_seed, prompt_id, sample])
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x and c, in int64 without overflow (16-bit halves of c)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser: every input bit flips each output bit with probability ~1/2."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def counter_uniforms(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1), float64, shape (len(seeds), len(steps)): a pure function of (seed, step).

    A counter-based generator: each value hashes its generation's 63-bit seed and the step
    (two 32-bit lanes through chained MurmurHash3 finalisers, 53 bits kept), so no state is
    carried and any subset of rows or steps is computed alone, for the whole batch at once.
    """
    lo, hi = (seeds & _M32)[:, None], (seeds >> 32)[:, None]
    step = (steps[None, :] & _M32) * 2

    def lane(n: int) -> torch.Tensor:
        h = _mix32((step + n) ^ 0x9E3779B9)
        h = _mix32(h ^ hi)
        h = _mix32(h ^ lo)
        return _mix32(h ^ (0x7F4A7C15 + n))

    bits = (lane(0) << 21) | (lane(1) >> 11)  # 53 random bits
    return (bits.double() + 0.5) / 2.0**53


def inverse_cdf_pick(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row from softmax(scores) by inverse-CDF with the row's uniform; (B,) long."""
    probs = torch.softmax(scores.float(), dim=-1)
    cdf = probs.double().cumsum_(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(1)
    picks = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=scores.shape[-1] - 1)
    # rounding at the very top of the CDF could land on a zero-probability tail token
    zero = probs.gather(1, picks[:, None]).squeeze(1) == 0
    return torch.where(zero, probs.argmax(dim=-1), picks)


class SeededSampler(LogitsProcessor):
    """Samples each row with its own generation's seed, for the whole batch in a few kernels.

    Row i's token at step t is the inverse-CDF draw of softmax(scores[i]) at
    `counter_uniforms(seed_i, t)`: it depends on the generation's seed and step only, never
    on the other rows of the batch, and there is no per-row loop. As a logits processor
    (inside transformers' generate) it returns scores whose argmax is the sample; the
    engine's decode loop calls `pick` and keeps `rows` to the live rows.
    """

    method = "inverse-CDF draw with counter-based uniforms keyed by (generation seed, step)"

    def __init__(self, seeds: list[int], device, max_steps: int = 256) -> None:
        self.seeds = torch.tensor(seeds, dtype=torch.long, device=device)
        self.table = counter_uniforms(self.seeds, torch.arange(max_steps, device=device))
        self.rows: torch.Tensor | None = None  # the live rows' indices into `seeds` (None: all)
        self.step = 0

    def uniforms(self, step: int) -> torch.Tensor:
        if step >= self.table.shape[1]:  # past the precomputed steps: compute this column alone
            col = counter_uniforms(self.seeds, torch.tensor([step], device=self.seeds.device))[:, 0]
        else:
            col = self.table[:, step]
        return col if self.rows is None else col[self.rows]

    def pick(self, scores: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
        """Each live row's draw at `step` (one step for all, or each row's own: a tensor)."""
        if isinstance(step, int):
            return inverse_cdf_pick(scores, self.uniforms(step))
        rows = self.rows if self.rows is not None else torch.arange(len(self.seeds), device=self.seeds.device)
        # a row past max_new_tokens has finished (its pick is discarded): clamped, without a host sync
        return inverse_cdf_pick(scores, self.table[rows, step.clamp(max=self.table.shape[1] - 1)])

    def __call__(self, input_ids, scores):
        picks = self.pick(scores, self.step)
        self.step += 1
        out = torch.full_like(scores, -float("inf"))
        return out.scatter_(1, picks[:, None], 0.0)


def build_warpers(cfg: Mapping[str, Any], device) -> list[LogitsProcessor]:
    """transformers' own warpers for a sampling config, in the order generate() applies them, on `device`."""
    w: list[LogitsProcessor] = []
    if (cfg.get("temperature") or 1.0) != 1.0:
        w.append(lp.TemperatureLogitsWarper(cfg["temperature"]))
    if cfg.get("top_k"):
        w.append(lp.TopKLogitsWarper(top_k=cfg["top_k"]))
    if (cfg.get("top_p") or 1.0) < 1.0:
        w.append(lp.TopPLogitsWarper(top_p=cfg["top_p"]))
    if cfg.get("min_p") is not None:
        w.append(lp.MinPLogitsWarper(min_p=cfg["min_p"]))
    if (cfg.get("typical_p") or 1.0) < 1.0:
        w.append(lp.TypicalLogitsWarper(mass=cfg["typical_p"]))
    if cfg.get("epsilon_cutoff"):
        w.append(lp.EpsilonLogitsWarper(epsilon=cfg["epsilon_cutoff"]))
    if cfg.get("eta_cutoff"):
        w.append(lp.EtaLogitsWarper(epsilon=cfg["eta_cutoff"], device=device))
    return w
