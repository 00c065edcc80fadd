"""A job's generations, one per (prompt, sample), and best_of's choice among a prompt's samples.

A variant with `samples: n` gives every prompt of its job n generations; the decode loop prefills the
prompt once and decodes its n rows side by side (worker.engine.decode), each drawing with its own seed
(`seeds`: worker.engine.sampling.generation_seed of the job seed, the prompt id and the sample index,
so a sample's tokens depend on nothing else). A batch's output rows are its prompts' samples, prompt
after prompt (`generations` lays them out with their prompts, samples and seeds).

`best_of` keeps, per prompt, the sample with the highest mean token log-probability (the negated NLL
per token under the generating model or the sweep's scorer: worker.engine.scoring), the lowest sample
index among equals; a sample with no token to score never wins over one that has.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.core.contract import JobSpec, PromptItem
from worker.core.results import GenerationRecord
from worker.engine.sampling import generation_seed


@dataclass(frozen=True)
class Generated:
    """One generation of a job as the engine left it: its prompt, sample and seed, and what it wrote."""

    prompt: PromptItem
    sample: int
    seed: int
    batch: int  # index of the batch (or stream) that produced it within its job
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    stop_reason: str

    def record(self, job: JobSpec, best_of: list[float | None] | None = None, **measures) -> GenerationRecord:
        """Its generation record, as both engines write it: with best_of's sample scores of its prompt, and
        any scores and features (`measures`)."""
        return GenerationRecord.of(
            job,
            self.prompt,
            seed=self.seed,
            text=self.text,
            token_ids=self.token_ids,
            stop_reason=self.stop_reason,
            batch=self.batch,
            sample=self.sample,
            best_of=best_of,
            **measures,
        )


def seeds(job: JobSpec) -> dict[str, list[int]]:
    """prompt id -> the seeds of its samples, in sample order (one seed without samples)."""
    n = job.strategy.n_samples
    return {p.id: [generation_seed(job.seed, p.id, i) for i in range(n)] for p in job.prompts}


def generations(outputs, seeds_of: dict[str, list[int]]) -> list[Generated]:
    """Every generation of `outputs` ([(prompts, BatchOutput)], a batch's rows its prompts' samples prompt after
    prompt), in the batches' order."""
    out = []
    for index, (prompts, part) in enumerate(outputs):
        each = [(p, i, s) for p in prompts for i, s in enumerate(seeds_of[p.id])]
        rows = zip(each, part.prompt_ids, part.token_ids, part.texts, part.stop_reasons, strict=True)
        for (p, i, seed), prompt_ids, ids, text, reason in rows:
            out.append(Generated(p, i, seed, index, prompt_ids, ids, text, reason))
    return out


def mean_logprob(nll: tuple[float | None, int | None]) -> float | None:
    """A generation's mean token log-probability from its (nll_sum, nll_count); None where nothing was scored."""
    total, count = nll
    return None if total is None or not count else -total / count


def keep_best(items: list[Generated], nlls: list[tuple[float | None, int | None]]):
    """Per prompt, the sample with the highest mean log-probability: [(kept generation, its nll, every sample's
    mean log-probability in sample order)], in the prompts' first appearance."""
    by_prompt: dict[str, list[tuple[Generated, tuple]]] = {}
    for g, nll in zip(items, nlls, strict=True):
        by_prompt.setdefault(g.prompt.id, []).append((g, nll))
    kept = []
    for group in by_prompt.values():
        group.sort(key=lambda pair: pair[0].sample)
        scores = [mean_logprob(nll) for _, nll in group]
        best = max(range(len(group)), key=lambda i: (scores[i] is not None, scores[i] or 0.0, -i))
        kept.append((group[best][0], group[best][1], scores))
    return kept
