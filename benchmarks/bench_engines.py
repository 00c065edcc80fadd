"""decodebench's own engine against vLLM on the same model, prompts and strategies, side by side in one run.

Runs in .venv-vllm (scripts/setup-vllm.sh), where both engines are installed: `make bench` calls it
there when that environment exists. For each strategy (greedy, top_p 0.9) and batch size (1 and
auto), both engines run the same job (local mode's `generate_job`, warm-up included, then timed),
round after round, interleaved; a ratio is the median of the rounds' ratios of tokens/s (> 1 where
vLLM is faster). Greedy outputs are checked token-identical between the engines; for top_p the
two engines' mean lengths are printed beside each other (texts differ by design, docs/engines.md).
On a GPU host (`--device cuda:0 --model PATH --dtype bfloat16`) it also records each side's fraction
of the memory-bandwidth bound: tokens/s × weight bytes / the device's bandwidth (`--bandwidth-gbs`).

    .venv-vllm/bin/python benchmarks/bench_engines.py [--rounds 3] [--prompts 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _jobs(model: str, dtype: str, prompts: int, batch, strategy: dict, device: str):
    from controller.sweep.load import parse_spec
    from controller.sweep.plan import plan

    # batch 1: vLLM too runs one sequence at a time (max_num_seqs 1); auto: its own scheduler, up to 64
    vllm = {"name": "vllm", "dtype": dtype, "max_model_len": 256, "max_num_seqs": 1 if batch == 1 else 64}
    if device == "cpu":
        vllm["kv_cache_space_gb"] = 1
    data = {
        "name": "bench-engines",
        "models": [{"path": model, "dtype": dtype}],
        "prompts": {"path": str(REPO / "examples/prompts/austen-heldout.jsonl"), "limit": prompts, "shard_size": 512},
        "strategies": [strategy],
        "generation": {"max_new_tokens": 48, "batch_size": batch, "seeds": [0]},
        "engines": [{"name": "decodebench"}, vllm],
    }
    jobs = plan(parse_spec(data, base_dir=REPO))
    return next(j for j in jobs if j.engine is None), next(j for j in jobs if j.engine is not None)


def _timed(job, runtime):
    from worker.engine.job import engine_generate

    started = time.perf_counter()
    result, records = engine_generate(job, runtime)
    wall = time.perf_counter() - started
    gen_s = sum(b.total_s for b in result.batches)
    return result.new_tokens / gen_s, wall, records


def _pair(args, runtime, strategy: dict, batch):
    own, vllm = _jobs(args.model, args.dtype, args.prompts, batch, strategy, args.device)
    ratios, own_tps, vllm_tps = [], [], []
    for r in range(args.rounds):
        order = [(own, own_tps), (vllm, vllm_tps)]
        outs = {}
        for job, sink in order if r % 2 == 0 else order[::-1]:
            tps, _, records = _timed(job, runtime)
            sink.append(tps)
            outs[job.engine is None] = records
        ratios.append(vllm_tps[-1] / own_tps[-1])
    same = None
    if strategy["name"] == "greedy":
        a = {g.prompt_id: g.token_ids for g in outs[True]}
        same = sum(a[g.prompt_id] == g.token_ids for g in outs[False]) / len(outs[False])
    lengths = [statistics.mean(g.n_new_tokens for g in outs[k]) for k in (True, False)]
    return {
        "strategy": strategy["name"],
        "batch_size": batch,
        "vllm_vs_own": round(statistics.median(ratios), 3),
        "own_tokens_per_s": round(statistics.median(own_tps), 1),
        "vllm_tokens_per_s": round(statistics.median(vllm_tps), 1),
        "greedy_identical": same,
        "mean_length_own_vllm": [round(x, 2) for x in lengths],
    }


def _bandwidth_fraction(row: dict, model: str, bandwidth_gbs: float | None) -> None:
    """Fraction of the memory-bandwidth bound (each token reads every weight once at batch 1)."""
    if not bandwidth_gbs:
        return
    weights = sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))
    if not weights:
        return
    bound = bandwidth_gbs * 1e9 / weights
    for side in ("own", "vllm"):
        row[f"{side}_fraction_of_bandwidth_bound"] = round(row[f"{side}_tokens_per_s"] / bound, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "examples/models/austen-small"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--bandwidth-gbs", type=float, default=None, help="device memory bandwidth (GB/s), GPU only")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    from worker.engine.job import Runtime

    runtime = Runtime(args.device)
    rows = []
    for strategy in ({"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}):
        for batch in (1, "auto"):
            row = _pair(args, runtime, strategy, batch)
            if batch == 1:
                _bandwidth_fraction(row, args.model, args.bandwidth_gbs)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"{'strategy':8} {'batch':>5} {'own tok/s':>10} {'vllm tok/s':>10} {'vllm/own':>8}  greedy identical")
    for r in rows:
        same = "" if r["greedy_identical"] is None else f"{r['greedy_identical']:.0%}"
        own, vl = r["own_tokens_per_s"], r["vllm_tokens_per_s"]
        print(f"{r['strategy']:8} {r['batch_size']!s:>5} {own:>10} {vl:>10} {r['vllm_vs_own']:>8}  {same}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": args.device, "model": args.model, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
