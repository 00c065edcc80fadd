"""Beam search's step of the decode loop driven on one batch, as the tests of the search read it: every
prompt's hypotheses with their scores and lengths (`search`), its best one (`generate`); and a model that
counts the rows of its forward passes."""

from __future__ import annotations

import torch

from worker.engine import decode
from worker.engine.call import ModelCall
from worker.engine.choose import Rules
from worker.engine.loops.beam_step import BeamStep
from worker.engine.modifiers import RowModifiers
from worker.engine.rows import Ends
from worker.engine.timing import StepClock


def beam_step(model, enc, cfg, params, check_every: int = 1) -> tuple[BeamStep, decode.DecodeOutput]:
    """Beam search's chooser through the decode loop on one left-padded batch (no refill): the chooser, with
    every prompt's pools, and the loop's output."""
    device = enc["input_ids"].device
    clock = StepClock(device)
    clock.start()
    ends = Ends([cfg.eos_token_id], cfg.pad_token_id, cfg.max_new_tokens)
    rules = Rules(RowModifiers(cfg), None, None, ends)
    total = enc["input_ids"].shape[0]
    tokens = torch.full((total, ends.max_new + 1), ends.fill, dtype=torch.long, device=device)
    step = BeamStep(rules, None, tokens, **BeamStep.options(params))
    call = ModelCall.of(model, mask=False, preallocated=True)
    out = decode.Loop(call, step, clock, check_every).run(enc)
    clock.stop()
    return step, out


def search(model, enc, cfg, params, check_every: int = 1):
    """All finished hypotheses: token ids (B, num_beams, prompt + max_new), scores (B, num_beams), new
    lengths; columns g*K .. g*K+K-1 are group g's, best first."""
    step, _ = beam_step(model, enc, cfg, params, check_every)
    batch, n = enc["input_ids"].shape[0], params["num_beams"]
    prompts = enc["input_ids"][:, None].expand(batch, n, -1)
    hyps = torch.cat([prompts, step.hyp.view(batch, n, -1)], dim=-1)
    return hyps, step.hyp_score.view(batch, n), step.hyp_len.view(batch, n)


def generate(model, enc, cfg, params):
    """Each prompt's best hypothesis, (batch, prompt + new), padded after its end."""
    _, out = beam_step(model, enc, cfg, params)
    return torch.cat([enc["input_ids"], out.tokens], dim=-1)


class CountingModel:
    """The model, recording the rows of every forward pass (prefill first)."""

    def __init__(self, model) -> None:
        self.model, self.rows = model, []

    @property
    def forward(self):
        return self.model.forward

    def __getattr__(self, name):  # config, device, ...: the model's
        return getattr(self.model, name)

    def __call__(self, **kwargs):
        self.rows.append(kwargs["input_ids"].shape[0])
        return self.model(**kwargs)
