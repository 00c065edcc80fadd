"""Synthetic sweeps for the aggregation, report and HTML tests: no models, no torch.

`make_sweep` builds JobResult and GenerationRecord objects as a worker would write
them. A generation's text depends only on (cell, seed, prompt), never on the shard,
so splitting the same prompts into 1 or 4 shards yields the same generations.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Iterable

from controller.metrics import CellData, Metric, item_rows, ratio
from controller.report.load.sweep import SweepData
from worker.core import paths
from worker.core.contract import GenerationSettings, JobSpec, ModelSpec, PromptItem, StrategySpec
from worker.core.engines import OWN_ENGINE, VllmEngine
from worker.core.registry import Registry
from worker.core.results import BatchTiming, GenerationRecord, JobResult
from worker.store import Store

VOCAB = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "was",
    "she",
    "he",
    "it",
    "her",
    "his",
    "that",
    "with",
    "for",
    "not",
    "be",
    "mr",
    "elizabeth",
    "darcy",
]
CELLS = [("austen-tiny", "greedy", {}), ("austen-tiny", "top_p", {"p": 0.9, "temperature": 1.0})]
STOCHASTIC = {"top_p", "sample", "top_k"}


def prompts(n: int = 8, with_references: bool = True) -> list[PromptItem]:
    return [
        PromptItem(
            id=f"p{i:03d}",
            prompt=f"Prompt number {i} <b>&",
            reference=(f"reference {i} the cat sat on the mat the cat" if with_references else None),
        )
        for i in range(n)
    ]


def _text(cell: str, seed: int, prompt_id: str, strategy: str) -> tuple[str, int, str]:
    rng = random.Random(f"{cell}|{seed if strategy in STOCHASTIC else 0}|{prompt_id}")
    n = rng.randint(4, 14)
    words = [rng.choice(VOCAB[:6]) if strategy == "greedy" else rng.choice(VOCAB) for _ in range(n)]
    if strategy == "greedy":
        words = (words[:3] * 5)[:n]  # greedy repeats itself
    return " ".join(words), n, "eos" if n < 12 else "length"


def _job_records(job: JobSpec, model: str, params: dict, with_nll: bool) -> tuple[list[BatchTiming], list]:
    """The synthetic batches and generations of one job."""
    strategy, seed, cell, batch_size = job.strategy.name, job.seed, job.cell, job.generation.batch_size
    text_cell = "::".join(cell.split("::")[:2])  # another engine's cell writes the own engine's texts
    batches, records = [], []
    for b, start in enumerate(range(0, len(job.prompts), batch_size)):
        batch = job.prompts[start : start + batch_size]
        new = 0
        for p in batch:
            text, n, stop = _text(text_cell, seed, p.id, strategy)
            new += n
            records.append(
                GenerationRecord(
                    job_id=job.job_id,
                    cell=cell,
                    model=model,
                    strategy=strategy,
                    params=params,
                    seed=seed * 1000 + int(p.id[1:]),
                    job_seed=seed,
                    prompt_id=p.id,
                    prompt=p.prompt,
                    reference=p.reference,
                    text=text,
                    token_ids=list(range(n)),
                    n_new_tokens=n,
                    stop_reason=stop,
                    batch=b,
                    nll_sum=(2.0 * n if with_nll else None),
                    nll_count=(n if with_nll else None),
                )
            )
        prefill = 0.01 + 0.001 * int(batch[0].id[1:])
        total = prefill + 0.005 * new * (2 if strategy == "top_p" else 1)
        batches.append(
            BatchTiming(
                n=len(batch),
                batch_size=batch_size,
                input_tokens=5 * len(batch),
                new_tokens=new,
                prefill_s=prefill,
                total_s=total,
                decode_s=total - prefill,
            )
        )
    return batches, records


def _job_result(job: JobSpec, model: str, batches: list[BatchTiming]) -> JobResult:
    return JobResult(
        job=job,
        started_at="2024-01-01T00:00:00Z",
        finished_at="2024-01-01T00:00:01Z",
        generation_config={"do_sample": job.strategy.name in STOCHASTIC},
        batches=batches,
        load_s=0.1,
        n_generations=len(job.prompts),
        new_tokens=sum(b.new_tokens for b in batches),
        memory={
            "torch_peak_mb": None,
            "rss_peak_mb": 500.0 + 10 * job.shard,
            "nvml_peak_mb": None,
            "nvml_mean_mb": None,
            "gpu_util_mean": None,
        },
        provenance={
            "device": "cpu",
            "torch": "2.4.0",
            "transformers": "4.56.0",
            "model_hash": f"sha256:{model}",
            "host": "test-host",
        },
    )


def make_sweep(
    *,
    n_prompts: int = 8,
    shard_size: int = 8,
    seeds: tuple[int, ...] = (0,),
    cells=CELLS,
    batch_size: int = 2,
    with_references: bool = True,
    with_nll: bool = True,
    tenant: str = "default",
    sweep_id: str = "sweep0000000000a",
    engines: tuple[str, ...] = (),
) -> SweepData:
    """`engines`: the engine labels every cell runs on (a sweep's `engines:`), the own engine's cells keeping
    their names and another engine's named `model::variant::engine`; empty: the own engine alone."""
    items = prompts(n_prompts, with_references)
    shards = [items[i : i + shard_size] for i in range(0, len(items), shard_size)]
    results, records = [], []
    runs = [(*c, e) for c in cells for e in engines or (OWN_ENGINE,)]
    for model, strategy, params, engine in runs:
        variant = strategy if not params else f"{strategy}({','.join(f'{k}={v}' for k, v in sorted(params.items()))})"
        cell = f"{model}::{variant}" + ("" if engine == OWN_ENGINE else f"::{engine}")
        for seed in seeds if strategy in STOCHASTIC else seeds[:1]:
            for index, shard in enumerate(shards):
                job = JobSpec(
                    tenant=tenant,
                    sweep_id=sweep_id,
                    sweep_name="synthetic",
                    job_id=hashlib.sha256(f"{sweep_id}|{cell}|{seed}|{index}".encode()).hexdigest()[:16],
                    engine=None if engine == OWN_ENGINE else VllmEngine(name="vllm", label=engine),
                    cell=cell,
                    model=ModelSpec(path=f"/models/{model}"),
                    strategy=StrategySpec(name=strategy, params=params),
                    seed=seed,
                    shard=index,
                    n_shards=len(shards),
                    prompts=shard,
                    generation=GenerationSettings(max_new_tokens=14, batch_size=batch_size),
                )
                batches, job_records = _job_records(job, model, params, with_nll)
                records += job_records
                results.append(_job_result(job, model, batches))
    spec = {
        "name": "synthetic",
        "models": [{"path": f"/models/{m}"} for m in dict.fromkeys(c[0] for c in cells)],
        "strategies": [{"name": s, "params": p} for _, s, p in cells],
        "generation": {"seeds": list(seeds)},
        **({"engines": [{"name": e if e == OWN_ENGINE else "vllm"} for e in engines]} if engines else {}),
    }
    return SweepData(tenant=tenant, sweep_id=sweep_id, spec=spec, results=results, generations=records)


def write_sweep(store: Store, data: SweepData) -> None:
    """Write the sweep as workers and the controller would: spec, results, generations."""
    store.write_json(paths.spec_key(data.tenant, data.sweep_id), data.spec)
    for r in data.results:
        job_id = r.job.job_id
        store.write_jsonl(
            paths.generations_key(data.tenant, data.sweep_id, job_id),
            [g.model_dump() for g in data.generations if g.job_id == job_id],
        )
        store.write_json(paths.result_key(data.tenant, data.sweep_id, job_id), r.model_dump(mode="json"))


def write_with_hashes(store: Store, data: SweepData, *, change: str | None = None) -> None:
    """Write the sweep as workers do, each result.json carrying its generations' SHA-256 (what the report
    streams a cell's generations by); `change`: a job whose texts are written otherwise (a retry's)."""
    from worker.store.base import jsonl_bytes

    store.write_json(paths.spec_key(data.tenant, data.sweep_id), data.spec)
    by_job: dict[str, list[dict]] = {}
    for g in data.generations:
        by_job.setdefault(g.job_id, []).append(g.model_dump())
    for r in data.results:
        rows = by_job.get(r.job.job_id, [])
        if r.job.job_id == change:
            rows = [{**row, "text": row["text"] + " again"} for row in rows]
        body = jsonl_bytes(rows)
        store.write_bytes(paths.generations_key(data.tenant, data.sweep_id, r.job.job_id), body)
        result = r.model_copy(update={"generations_sha256": hashlib.sha256(body).hexdigest()})
        store.write_json(paths.result_key(data.tenant, data.sweep_id, r.job.job_id), result.model_dump(mode="json"))


# -- throwaway metrics: the aggregation is tested without the real metric implementations --


def registry(metrics: Iterable[Metric]) -> Registry[Metric]:
    """A fresh metric registry holding `metrics` (`summarize(data, metrics=...)` takes it)."""
    out: Registry[Metric] = Registry("metric")
    for m in metrics:
        out.register(m.name, m)
    return out


def _mean_length(c: CellData):
    return item_rows([(len(w), 1) for w in c.words], 2)


def _distinct_2(c: CellData):
    grams = [g for w in c.words for g in zip(w, w[1:])]
    return len(set(grams)) / len(grams) if grams else None


def _rep_2(c: CellData):
    """A mean of per-generation repetition rates over the generations that have a bigram."""
    rows = []
    for w in c.words:
        grams = list(zip(w, w[1:]))
        rows.append((1 - len(set(grams)) / len(grams), 1) if grams else (0, 0))
    return item_rows(rows, 2)


def _perplexity(c: CellData):
    if not c.nll_sum or any(v is None for v in c.nll_sum):
        return None
    return item_rows(list(zip(c.nll_sum, c.nll_count)), 2)


def _bleu(c: CellData):
    pairs = [(w, r) for w, r in zip(c.words, c.references) if r]
    if not pairs:
        return None
    hits = sum(sum((Counter(w) & Counter(r.lower().split())).values()) for w, r in pairs)
    return 100.0 * hits / max(1, sum(len(w) for w, _ in pairs))


def _eos_rate(c: CellData):
    return item_rows([(s == "eos", 1) for s in c.stop_reasons], 2) if c.stop_reasons else None


def toy_metrics() -> Registry[Metric]:
    """Six toy metrics in a fresh registry: four additive (bootstrap), two plain (jackknife)."""

    def additive(name, per_item, level, hib, combine=ratio, model=False):
        return Metric(
            name=name,
            description=f"toy {name}",
            level=level,
            higher_is_better=hib,
            needs_model=model,
            per_item=per_item,
            combine=combine,
        )

    def plain(name, fn, level, hib, refs=False):
        return Metric(
            name=name, description=f"toy {name}", level=level, higher_is_better=hib, needs_references=refs, fn=fn
        )

    return registry(
        [
            additive("mean_length", _mean_length, "sequence", None),
            additive("rep_2", _rep_2, "sequence", False),
            plain("distinct_2", _distinct_2, "corpus", True),
            additive(
                "perplexity",
                _perplexity,
                "corpus",
                False,
                combine=lambda s: math.exp(s[0] / s[1]) if s[1] else None,
                model=True,
            ),
            plain("bleu", _bleu, "corpus", True, refs=True),
            additive("eos_rate", _eos_rate, "sequence", None),
        ]
    )


CELLS = [("m", "greedy", {}), ("m", "top_p", {"p": 0.9}), ("m", "top_k", {"k": 5}), ("n", "greedy", {})]


def scored_cell(key: str, per_prompt: list[list[str]], names: Iterable[str]):
    """`cells.score`'s statistics of a cell whose prompt g (`p{g}`) has the generations per_prompt[g] (its first one
    first), scored on `names` with 200 replicates: a cell for the paired comparisons' tests."""
    from controller.metrics import METRICS, cell_data
    from controller.report.compute.cells import Settings, score
    from controller.report.stats.intervals import prompt_groups

    names = tuple(names)
    records = [{"text": t, "prompt_id": f"p{g}"} for g, gens in enumerate(per_prompt) for t in gens]
    data = cell_data(records)
    settings = Settings(names, with_ci=True, n_boot=200, n_boot_corpus=200, seed=0, sample_size=None)
    selected = [(n, METRICS.get(n)) for n in names]
    prompts = [f"p{g}" for g in range(len(per_prompt))]
    row = {"model": "m", "strategy": key}
    return score(selected, settings, row, data, prompt_groups(data.prompt_ids), key, prompts=prompts)[1]
