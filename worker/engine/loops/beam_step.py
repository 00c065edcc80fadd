"""Beam search, with groups, as a step of the engine's decode loop (worker.engine.decode).

transformers' beam search with one group (token for token generate()'s, tests/unit/worker/engine/loops/test_beam.py);
diverse beam search with several (`worker.strategies.diverse_beam` has the method), written per
prompt, so that the decode loop's compaction and continuous refill apply: a prompt occupies `num_beams`
consecutive rows; once its search is over its rows leave at the next check, and the queue's
next prompts take them. A prompt's pools (running scores, its groups' finished hypotheses)
are kept per queued prompt, and each step works on the live prompts' rows only, at each
prompt's own step (prompts that joined later are at earlier steps).

`BeamStep` is the token chooser (worker.engine.choose) of the search. After the prefill
(`prefilled`) each prompt's row is copied to its beams. Each loop step: `advance` takes the rows'
last logits, scores every group's candidates, updates the pools, reorders the rows (and the KV
cache, in place) to the beams' parents and appends the beams' tokens; the loop's model call
(worker.engine.call) runs the model on those tokens. At the end `finish` writes each prompt's best
hypothesis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from worker.engine.choose import Chooser, Finished
from worker.strategies.diverse_beam import check_groups


@dataclass
class BeamStep(Chooser):
    """(Diverse) beam search's token choice in the decode loop: `num_beams` rows a prompt, the search's state
    per queued prompt, every prompt's best hypothesis written out by `finish`."""

    num_beams: int = 4
    num_beam_groups: int = 1
    diversity_penalty: float = 0.0
    length_penalty: float = 1.0
    early_stopping: bool = False
    stopping: str = "best_running"  # what a group's worst hypothesis must beat: see `_stop_groups`

    @classmethod
    def options(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        keys = ("num_beams", "num_beam_groups", "diversity_penalty", "length_penalty", "early_stopping")
        return {**{k: params[k] for k in keys if k in params}, "stopping": params.get("stopping") or "best_running"}

    @property
    def rows_each(self) -> int:
        return self.num_beams

    def __post_init__(self) -> None:
        super().__post_init__()
        check_groups(self.num_beams, self.num_beam_groups)
        self.max_new = self.ends.max_new
        total, dev = self.tokens.shape[0], self.tokens.device
        g, k = self.num_beam_groups, self.num_beams // self.num_beam_groups
        self.run = torch.full((total, g, k), -1e9, device=dev)
        self.run[..., 0] = 0.0  # only the first beam of each group is live at first (all are copies)
        self.hyp = torch.full((total, g, k, self.max_new), self._pad(), dtype=torch.long, device=dev)
        self.hyp_score = torch.full((total, g, k), -1e9, device=dev)
        self.hyp_len = torch.zeros((total, g, k), dtype=torch.long, device=dev)
        self.done = torch.zeros((total, g, k), dtype=torch.bool, device=dev)
        self.improvable = torch.ones((total, g), dtype=torch.bool, device=dev)
        self.used = torch.full((total,), -1, dtype=torch.long, device=dev)  # steps until the search ended
        self.eos_ids = torch.tensor(self.ends.eos, dtype=torch.long, device=dev)
        self._work = None  # (the rows' layout, their prompts, the prompts' state)

    def _pad(self) -> int:
        return self.ends.fill

    def prefilled(self, call, out, rows, cache):
        """Every prompt's row copied to its beams (rows and cache); the beams' last logits."""
        beams = torch.arange(rows.live.numel(), device=rows.live.device).repeat_interleave(self.num_beams)
        rows.reorder(beams, cache)
        return _Logits(out.logits[:, -1:][beams])

    def advance(self, out, rows, cache) -> None:
        """One step of every live prompt's search; the rows become the beams' parents plus their tokens."""
        logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        logp = self.processors(rows, logp)
        n, groups = self.num_beams, self.num_beam_groups
        prompts, t = rows.live[::n], rows.steps[::n]  # queue index and tokens so far, per live prompt
        parents, tokens, searched = self._search(rows, logp.view(prompts.numel(), groups, n // groups, -1), prompts, t)
        rows.reorder(parents.view(-1), cache)
        rows.append(tokens.view(-1))
        rows.unfinished = searched.repeat_interleave(n)

    def _search(self, rows, logp, prompts, t):
        """The groups' candidates of each live prompt: (parent rows, tokens) of its next beams, and whether
        its search goes on. The pools of `prompts` are read and written back."""
        p, groups, k, vocab = logp.shape
        dev = logp.device
        n_cand = max(2, 1 + self.eos_ids.numel()) * k  # enough candidates that k survive even if some end
        may_finish = torch.arange(n_cand, device=dev) < k  # only the top k may become hypotheses
        row_base = (torch.arange(p, device=dev) * self.num_beams)[:, None]
        last = t == self.max_new - 1
        norm = (t + 1).float()[:, None] ** self.length_penalty  # (p, 1): the length penalty at this step
        run, improvable, hyp, hyp_score, hyp_len, done, used = self._working(rows, prompts)
        chosen = logp.new_zeros(p, vocab)  # per prompt: how many earlier-group beams picked each token now
        parents = torch.empty((p, groups, k), dtype=torch.long, device=dev)
        tokens = torch.empty((p, groups, k), dtype=torch.long, device=dev)
        all_stop = torch.ones(p, dtype=torch.bool, device=dev)  # per prompt: every candidate stopped
        best = torch.empty((p, groups), device=dev)  # per group: its best candidate's score this step
        for g in range(groups):
            scores = logp[:, g] - self.diversity_penalty * chosen[:, None, :] if g else logp[:, g]
            cand_scores, flat = (run[:, g, :, None] + scores).reshape(p, k * vocab).topk(n_cand, dim=-1)
            cand_rows = row_base + g * k + flat // vocab
            cand_tok = flat % vocab
            stops = torch.isin(cand_tok, self.eos_ids)
            if self.stop is not None:
                cand_ids = torch.cat([rows.ids[cand_rows.reshape(-1)], cand_tok.reshape(-1, 1)], dim=-1)
                own = rows.steps[cand_rows.reshape(-1)] + 1  # a match lies in the new tokens only (stops.py)
                stops = stops | self.stop(cand_ids, None, own=own).view(p, n_cand)
            all_stop &= stops.all(dim=-1)
            best[:, g] = cand_scores[:, 0]
            kept, keep = (cand_scores - 1e9 * stops.float()).topk(k, dim=-1)  # the k best that run on
            run[:, g] = kept
            parents[:, g] = cand_rows.gather(1, keep)
            tokens[:, g] = cand_tok.gather(1, keep)
            finishing = (stops | last[:, None]) & may_finish & improvable[:, g, None]
            scored = cand_scores / norm - 1e9 * (~finishing).float()
            merged = torch.cat([hyp_score[:, g], scored], dim=1)
            top = merged.topk(k, dim=-1).indices
            hyp_score[:, g] = merged.gather(1, top)
            new = (top - k).clamp(min=0)  # where a kept slot is a new hypothesis: which candidate
            fresh = self._new_tokens(rows, cand_rows.gather(1, new), cand_tok.gather(1, new), t)
            hyp[:, g] = torch.where(
                (top >= k)[..., None],
                fresh,
                hyp[:, g].gather(1, top.clamp(max=k - 1)[..., None].expand(-1, -1, self.max_new)),
            )
            hyp_len[:, g] = torch.cat([hyp_len[:, g], (t + 1)[:, None].expand(p, n_cand)], dim=1).gather(1, top)
            done[:, g] = torch.cat([done[:, g], finishing], dim=1).gather(1, top)
            if self.diversity_penalty:  # this group's picks count against the later groups while it matters
                chosen.scatter_add_(1, tokens[:, g], improvable[:, g, None].float().expand(p, k).contiguous())
        best = run[..., 0] if self.stopping == "best_running" else best
        self._stop_groups(improvable, best / norm, hyp_score, done, all_stop, last)
        searched = improvable.any(dim=-1)
        used.copy_(torch.where(~searched & (used < 0), t + 1, used))  # the step its search ended, once
        return parents, tokens, searched

    def _stop_groups(self, improvable, best, hyp_score, done, all_stop, last) -> None:
        """transformers' early_stopping=False rule, in place: a group can still improve while its pool has an
        empty slot or `best` (length-penalised now) beats the pool's worst. `best` is the group's best
        running beam (`stopping` "best_running", transformers 5's rule) or the best of all its candidates
        this step, ending ones included ("best_candidate", the rule of transformers 4.x's group beam
        search); a group all of whose candidates stopped, or at the length limit, is over."""
        worst = torch.where(done, hyp_score.min(dim=-1, keepdim=True).values, -1e9)
        improvable &= (best[..., None] > worst).any(dim=-1) & ~all_stop[:, None]
        if self.early_stopping is True:
            improvable &= ~done.all(dim=-1)
        improvable &= ~last[:, None]  # at the length limit a search is over, for good

    def _pools(self) -> tuple[torch.Tensor, ...]:
        """The per-prompt state of the search, in one order: running scores, whether each group can still
        improve, each group's finished hypotheses (tokens, scores, lengths, real or empty slots), and the
        step its search ended at (-1: not yet)."""
        return self.run, self.improvable, self.hyp, self.hyp_score, self.hyp_len, self.done, self.used

    def _working(self, rows, prompts) -> tuple[torch.Tensor, ...]:
        """The live prompts' state, changed in place by the steps. It is gathered from the per-queue pools
        only when the prompts changed (rows left or joined, or another Rows: a refill's newcomers), and
        written back to them then and at the end: not at every step."""
        key = rows.layout
        if self._work is None or self._work[0] != key:
            self._flush()
            self._work = (key, prompts, tuple(pool[prompts] for pool in self._pools()))
        return self._work[2]

    def _flush(self) -> None:
        if self._work is not None:
            _, prompts, parts = self._work
            for pool, part in zip(self._pools(), parts):
                pool[prompts] = part
            self._work = None

    def _new_tokens(self, rows, cand_rows, cand_tok, t):
        """Each candidate's new tokens (its parent's t, then its own), padded to max_new: (p, n_cand, max_new)."""
        p, n_cand = cand_tok.shape
        j = torch.arange(self.max_new, device=cand_tok.device)
        src = rows.ids[cand_rows.reshape(-1)].view(p, n_cand, -1)
        cols = (rows.width - t[:, None, None] + j).clamp(max=rows.width - 1).expand(p, n_cand, self.max_new)
        before = src.gather(2, cols)
        out = torch.where(j < t[:, None, None], before, self._pad())
        return torch.where(j == t[:, None, None], cand_tok[..., None], out)

    def finish(self, rows) -> Finished:
        """Each prompt's best hypothesis as its output; its end is the hypothesis's, its time the search's."""
        self._flush()
        total = self.tokens.shape[0]
        scores = self.hyp_score.view(total, -1)
        best = scores.argmax(dim=-1)
        q = torch.arange(total, device=best.device)
        tokens = self.hyp.view(total, -1, self.max_new)[q, best]
        length = self.hyp_len.view(total, -1)[q, best]
        self.tokens[:, : self.max_new] = tokens
        last = tokens.gather(1, (length - 1).clamp(min=0)[:, None]).squeeze(1)
        at_eos = torch.isin(last, self.eos_ids) & (length > 0)
        n_new = torch.where(at_eos | (length < self.max_new), length, -1)
        used = torch.where(self.used > 0, self.used, length)
        return Finished(n_new.tolist(), at_eos.tolist(), used.tolist())


@dataclass
class _Logits:
    """The beams' last logits after the prefill, as a model's output holds them: (rows, 1, vocabulary)."""

    logits: torch.Tensor
