"""The engine's own cost, measured side by side with plain transformers in one run.

1. Instrumentation: `generate()` with decodebench's step timer and finish recorder
   against a bare `model.generate()` (greedy, same batches): the overhead of measuring.
2. Seeded sampling: decodebench's per-generation seeded sampler (transformers' warpers,
   then one torch.Generator per row) against transformers' own batch-wide sampling
   (top-p 0.9): the price of batch-independent reproducibility.
3. Batching: tokens/s at batch size 1 against batch size 16 (greedy).

Each pair runs interleaved, best of `--repeats`; the ratios are printed. CPU by default;
`--device cuda:0` on a GPU machine.

    python benchmarks/bench_engine.py [--model examples/models/austen-small] [--prompts 32] [--new 48]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from worker.core.contract import GenerationSettings, ModelSpec, PromptItem, StrategySpec
from worker.core.logs import configure
from worker.engine import generate as engine
from worker.engine.device import resolve_device
from worker.engine.models import load
from worker.engine.sampling import generation_seed

REPO = Path(__file__).resolve().parents[1]


def prompts(n: int) -> list[PromptItem]:
    lines = (REPO / "examples/prompts/austen-heldout.jsonl").read_text().splitlines()[:n]
    return [PromptItem(id=str(i), prompt=json.loads(line)["prompt"]) for i, line in enumerate(lines)]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_pair(a, b, repeats: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(repeats):  # interleaved, so drift hits both sides alike
        ta.append(timed(a))
        tb.append(timed(b))
    return min(ta), min(tb)


def runners(lm, batches, settings, new_tokens: int):
    """Factories of timed runs over the batches: bare transformers generate() and decodebench's engine."""
    tok, device = lm.tokenizer, lm.device

    def bare(strategy_kwargs):
        def run():
            for batch in batches:
                enc = tok([p.prompt for p in batch], return_tensors="pt", padding=True).to(device)
                with torch.inference_mode():
                    lm.model.generate(
                        **enc,
                        max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens,
                        pad_token_id=tok.pad_token_id,
                        **strategy_kwargs,
                    )

        return run

    def ours(name, params):
        plan = engine.configure_decoding(lm, StrategySpec(name=name, params=params), settings)

        def run():
            for batch in batches:
                engine.generate_batch(lm, plan, batch, [generation_seed(0, p.id) for p in batch])

        return run

    return bare, ours


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "examples/models/austen-small"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    configure(level="warning")

    device = resolve_device(args.device)
    lm = load(ModelSpec(path=args.model), device)
    items = prompts(args.prompts)
    batches = [items[i : i + args.batch] for i in range(0, len(items), args.batch)]
    settings = GenerationSettings(max_new_tokens=args.new, min_new_tokens=args.new, batch_size=args.batch)
    print(
        f"model {args.model} ({lm.info['n_params']:,} params) on {device}, torch {torch.__version__}, "
        f"{len(items)} prompts x {args.new} new tokens, batch {args.batch}, best of {args.repeats}"
    )

    bare, ours = runners(lm, batches, settings, args.new)
    ours("greedy", {})()  # warm-up
    tokens = len(items) * args.new

    t_bare, t_ours = best_pair(bare({"do_sample": False}), ours("greedy", {}), args.repeats)
    print(
        f"1. greedy   bare generate {tokens / t_bare:8.1f} tok/s   decodebench {tokens / t_ours:8.1f} tok/s   "
        f"overhead x{t_ours / t_bare:.3f}"
    )

    t_hf, t_seeded = best_pair(
        bare({"do_sample": True, "top_p": 0.9, "top_k": 0}), ours("top_p", {"p": 0.9}), args.repeats
    )
    print(
        f"2. top_p    transformers sampling {tokens / t_hf:8.1f} tok/s   "
        f"seeded per generation {tokens / t_seeded:8.1f} tok/s   "
        f"ratio x{t_seeded / t_hf:.3f}"
    )

    one = GenerationSettings(max_new_tokens=args.new, min_new_tokens=args.new, batch_size=1)
    plan1 = engine.configure_decoding(lm, StrategySpec(name="greedy"), one)

    def batch1():
        for p in items:
            engine.generate_batch(lm, plan1, [p], [0])

    t_one, t_many = best_pair(batch1, ours("greedy", {}), args.repeats)
    print(
        f"3. batching batch 1 {tokens / t_one:8.1f} tok/s   batch {args.batch} {tokens / t_many:8.1f} tok/s   "
        f"speed-up x{t_one / t_many:.2f}"
    )


if __name__ == "__main__":
    main()
