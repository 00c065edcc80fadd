"""`samples: 8` against 8 seeds as 8 separate jobs, on the same prompts, side by side.

Both sides write 8 generations of every prompt with top_p 0.9 (austen-small, float32, CPU unless
--device): `samples` is one job whose decode loop prefills each prompt once and repeats its row and
KV cache 8 times (worker.engine.decode); `seeds` is 8 jobs, seeds 0..7, each prefilling every prompt
again. Both sides run at the same `batch_size` (--batch prompts: `samples` decodes 8 rows a prompt, so
8 times the rows at once, as a sweep with `samples: 8` would) and score nothing (generation only).
Two prompt sets: the held-out prompts as they are (about 10
to 40 tokens) and long ones (prompt and reference cut to --long tokens), where the prefill is a larger
share of the work. Interleaved rounds (odd rounds reversed); the printed ratio is the median of the
rounds' ratios of tokens/s, > 1 where `samples` is faster; the prompt rows each side prefilled are
counted once, outside the timed rounds, with a forward hook on the model.

    python benchmarks/bench_samples.py [--prompts 16] [--new 32] [--batch 16] [--long 160] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.jobs import job  # noqa: E402
from benchmarks.sides import heldout, ratio, rounds, uniform_prompts  # noqa: E402
from worker.core.contract import JobSpec, ModelSpec, PromptItem  # noqa: E402
from worker.core.logs import configure  # noqa: E402
from worker.engine.job import Runtime, generate_job  # noqa: E402

N = 8
PARAMS = {"p": 0.9}


def long_prompts(tok, n: int, tokens: int) -> list[PromptItem]:
    """Held-out prompts with their reference appended, cut to `tokens` tokens."""
    out = []
    for row in heldout(n):
        ids = tok(row["prompt"] + " " + (row["reference"] or ""))["input_ids"][:tokens]
        out.append(PromptItem(id=row["id"], prompt=tok.decode(ids)))
    return out


def jobs(model: str, prompts, batch: int, new: int) -> dict[str, list[JobSpec]]:
    one = job(model, prompts, "top_p", PARAMS, batch_size=batch, max_new=new).model_copy(update={"compute": []})
    sampled = one.model_copy(update={"strategy": one.strategy.model_copy(update={"samples": N})})
    return {"samples": [sampled], "seeds": [one.model_copy(update={"seed": s}) for s in range(N)]}


def side(runtime, specs: list[JobSpec]):
    def run():
        tokens, ids = 0, []
        for spec in specs:
            result, records = generate_job(spec, runtime)
            tokens += result.new_tokens
            ids += [r.token_ids for r in records]
        return tokens, ids

    return run


def prefilled_rows(runtime, specs: list[JobSpec]) -> int:
    """The prompt rows the model was given in prefills (forward passes over more than one position)."""
    model = runtime.cache.get(specs[0].model, runtime.device).model
    count = [0]

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            count[0] += ids.shape[0]

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        side(runtime, specs)()
    finally:
        handle.remove()
    return count[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "examples/models/austen-small"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16, help="batch_size (prompts) of both sides")
    ap.add_argument("--long", type=int, default=160, help="tokens of the long prompts")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    configure(level="warning")
    runtime = Runtime(args.device)
    lm = runtime.cache.get(ModelSpec(path=args.model), runtime.device)
    print(
        f"model {args.model}, {args.prompts} prompts x {N} generations x {args.new} new tokens, top_p 0.9, "
        f"batch_size {args.batch}, {args.rounds} rounds, {args.device}"
    )
    sets = {
        "held-out": uniform_prompts(args.prompts),
        f"long ({args.long} tokens)": long_prompts(lm.tokenizer, args.prompts, args.long),
    }
    for name, prompts in sets.items():
        pair = jobs(args.model, prompts, args.batch, args.new)
        rows = {k: prefilled_rows(runtime, v) for k, v in pair.items()}
        stats, _ = rounds({k: side(runtime, v) for k, v in pair.items()}, args.rounds, runtime.device)
        r = ratio(stats["samples"], stats["seeds"])
        print(
            f"{name:20s} samples {stats['samples']['tokens_per_s']:8.1f} tok/s   "
            f"seeds {stats['seeds']['tokens_per_s']:8.1f} tok/s   samples_vs_seeds x{r:.2f}   "
            f"prompt rows prefilled {rows['samples']} vs {rows['seeds']}"
        )


if __name__ == "__main__":
    main()
