"""What the throughput benchmarks share: the held-out prompts, decodebench's side, and the interleaved rounds
that time the sides of a pair (bench_throughput.py, transformers_cb.py, bench_loops.py, bench_schedule.py)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from worker.core.contract import JobSpec, PromptItem
from worker.engine.job import Runtime, generate_job

REPO = Path(__file__).resolve().parents[1]


def heldout(n: int, offset: int = 0) -> list[dict]:
    lines = (REPO / "examples/prompts/austen-heldout.jsonl").read_text().splitlines()[offset : offset + n]
    return [json.loads(line) for line in lines]


def uniform_prompts(n: int) -> list[PromptItem]:
    return [PromptItem(id=row["id"], prompt=row["prompt"]) for row in heldout(n)]


def mixed_prompts(tok, n: int) -> list[PromptItem]:
    """Prompts of 10, 20, 30 and 40 tokens in turn (prompt and reference text cut to length)."""
    out = []
    for i, row in enumerate(heldout(n, offset=64)):
        ids = tok(row["prompt"] + " " + (row["reference"] or ""))["input_ids"][: 10 * (1 + i % 4)]
        out.append(PromptItem(id=row["id"], prompt=tok.decode(ids)))
    return out


def ours(runtime: Runtime, spec: JobSpec):
    """A run of decodebench's engine: (new tokens, token ids per prompt in the shard's order)."""

    def run():
        result, records = generate_job(spec, runtime)
        extra = [r.prompt_id for r in records if r.nll_sum is not None or r.features is not None]
        if extra:  # the peers only generate: a side that also scores or featurizes is not timed like them
            raise SystemExit(f"benchmark: the own engine's job scored or featurized {len(extra)} generations")
        return result.new_tokens, [r.token_ids for r in records]

    return run


def strip(row: list[int], eos: int) -> list[int]:
    """A row without its trailing eos/pad ids (the generate() loop cannot tell a stop string's padding from EOS)."""
    end = len(row)
    while end and row[end - 1] == eos:
        end -= 1
    return row[:end]


def rounds(sides: dict, n: int, device) -> tuple[dict, dict]:
    """Run every side once per round, interleaved; per side the median tokens/s (and each round's), last outputs.

    Odd rounds run the sides in reverse order, so a side is not always first after another's
    work (or always last): position effects cancel over the rounds."""
    rates: dict[str, list[float]] = {k: [] for k in sides}
    outputs = {}
    for i in range(n):
        for name, run in sides.items() if i % 2 == 0 else reversed(sides.items()):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            tokens, ids = run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            rates[name].append(tokens / (time.perf_counter() - start))
            outputs[name] = ids
    stats = {
        k: {"tokens_per_s": round(statistics.median(v), 2), "rounds": [round(x, 2) for x in v]}
        for k, v in rates.items()
    }
    return stats, outputs


def ratio(a: dict, b: dict) -> float:
    """The median of the per-round ratios: each round's two sides ran back to back, so a
    machine that slows down or speeds up between rounds moves both sides of a round alike."""
    return round(statistics.median(x / y for x, y in zip(a["rounds"], b["rounds"])), 3)


def against(key: str, stats: dict, outputs: dict, other: str, label: str, eos: int, note: str) -> tuple[float, str]:
    """A pair's ratio (decodebench against `other`) and how many outputs were identical ("same/all"),
    printed as one line with `note`."""
    same = sum(strip(a, eos) == strip(b, eos) for a, b in zip(outputs["decodebench"], outputs[other]))
    identical = f"{same}/{len(outputs[other])}"
    r = ratio(stats["decodebench"], stats[other])
    print(
        f"{key:24s} decodebench {stats['decodebench']['tokens_per_s']:9.1f} tok/s   "
        f"{label} {stats[other]['tokens_per_s']:9.1f} tok/s   x{r:.2f}   identical outputs {identical}   {note}"
    )
    return r, identical
