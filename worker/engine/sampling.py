"""Sampling: each generation's own seed, transformers' warpers, and the seeded sampler.

Sampling strategies do not use transformers' batch-wide RNG. The engine applies
transformers' own warpers (temperature, top-k, top-p, min-p, typical, epsilon, eta, in
transformers' order) and then draws each row's token from a torch.Generator seeded by
that generation's own seed. A generation's text therefore depends on its seed and
prompt, not on which prompts share its batch (up to the floating-point effects of
padding, which on GPU can flip a rare near-tie).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor
from transformers.generation import logits_process as lp

SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def generation_seed(job_seed: int, prompt_id: str) -> int:
    """Each generation's own seed: a hash of the job seed and the prompt id (63-bit)."""
    digest = hashlib.sha256(f"{job_seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


class SeededSampler(LogitsProcessor):
    """Samples each row from its own generator and returns scores whose argmax is that sample."""

    def __init__(self, seeds: list[int], device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids, scores):
        probs = torch.softmax(scores.float(), dim=-1)
        picks = torch.stack([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        out = torch.full_like(scores, -float("inf"))
        return out.scatter_(1, picks, 0.0)


def build_warpers(cfg: dict[str, Any]) -> list[LogitsProcessor]:
    """transformers' own warpers for a sampling config, in the order generate() applies them."""
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
        w.append(lp.EtaLogitsWarper(epsilon=cfg["eta_cutoff"], device=cfg["_device"]))
    return w


def build_modifiers(cfg: GenerationConfig, prompt_len: int) -> list[LogitsProcessor]:
    """The processors generate() would add for penalties and minimum length (for custom loops)."""
    m: list[LogitsProcessor] = []
    if cfg.min_new_tokens:
        m.append(lp.MinNewTokensLengthLogitsProcessor(prompt_len, cfg.min_new_tokens, cfg.eos_token_id))
    if cfg.repetition_penalty not in (None, 1.0):
        m.append(lp.RepetitionPenaltyLogitsProcessor(penalty=cfg.repetition_penalty))
    if cfg.no_repeat_ngram_size:
        m.append(lp.NoRepeatNGramLogitsProcessor(cfg.no_repeat_ngram_size))
    return m
