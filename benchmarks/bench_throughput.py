"""decodebench's engine against the ways people run generation by hand, side by side in one run.

`make bench` runs this on the CPU; `--device cuda:0` runs the same comparisons on a GPU and
adds the GPU section (benchmarks/throughput_gpu.py). Every pair runs interleaved, round
after round (odd rounds in reverse order); a ratio is the median of the rounds' ratios
(each side's tokens/s is the median of its rounds); each ratio is > 1 where decodebench is
faster:

- vs_generate: decodebench (local mode's `generate_job`) against a hand-written loop of
  `model.generate()` over the same batches, prompts and settings (greedy; the outputs are
  checked identical);
- vs_generate_mixed: the same on prompts whose lengths vary 4x, with the stop string "." so
  that rows end at different steps (where length buckets, compaction and refill pay);
- vs_generate_ragged: the mixed prompts with the stop string ",", so that most rows end well
  before max_new_tokens while some run to it;
  the generate() pairs also time decodebench with `refill: false` (`refill_vs_batches`), and
  report the generate() loop's `packing_bound`: the rows x steps it computed per token kept,
  which is what an engine that wasted no row-step could gain at the same cost per step;
- vs_transformers_cb: against transformers' own continuous batching (`generate_batch`, a
  paged KV cache) at the same number of requests at once, on the mixed prompts without a
  stop string (benchmarks/transformers_cb.py; outputs checked identical);
- beam_vs_generate: the `beam` strategy (4 beams, the mixed prompts, stop string ",") in
  decodebench's beam loop against the hand-written generate() loop with the same beams (the
  outputs are checked identical);
- vs_pipeline: against the per-prompt loop of `pipeline("text-generation")` (batch size 1),
  on the whole bundled held-out prompt set (128 prompts: one job of a sweep cell);
- auto_vs_best: `batch_size: auto` against the best of several hand-picked batch sizes (the
  probe runs once before the rounds, as it does once per model, device and lengths);
- sampler_vs_transformers: decodebench's seeded sampling (top-p 0.9, every generation its
  own seed) against `generate(do_sample=True)` with transformers' batch-wide sampling.

It writes benchmarks/results.json (or --out) with the ratios, the raw tokens/s of each
side, the device, the versions and the git commit.

    python benchmarks/bench_throughput.py [--device cpu] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.jobs import job  # noqa: E402
from benchmarks.sides import against, mixed_prompts, ours, ratio, rounds, strip, uniform_prompts  # noqa: E402
from worker.core.contract import ModelSpec  # noqa: E402
from worker.core.logs import configure  # noqa: E402
from worker.engine.job import Runtime, generate_job  # noqa: E402


def hand_generate(lm, prompts, batch_size: int, max_new: int, stop=(), min_new=0, sample=None, num_beams=1):
    """The hand-written loop: batches in the given order, left-padded, one generate() each, texts decoded.

    `run.row_steps` counts the rows x steps its last run computed (finished rows included)."""
    tok, eos = lm.tokenizer, lm.tokenizer.eos_token_id
    kwargs = {"do_sample": False} if sample is None else {"do_sample": True, **sample}
    if num_beams > 1:
        kwargs.update(num_beams=num_beams, early_stopping=False, length_penalty=1.0)
    if stop:
        kwargs.update(stop_strings=list(stop), tokenizer=tok)

    def run():
        tokens, ids, run.row_steps = 0, [], 0
        for i in range(0, len(prompts), batch_size):
            enc = tok([p.prompt for p in prompts[i : i + batch_size]], return_tensors="pt", padding=True).to(lm.device)
            with torch.inference_mode():
                out = lm.model.generate(
                    **enc, max_new_tokens=max_new, min_new_tokens=min_new or None, pad_token_id=eos, **kwargs
                )
            new = out[:, enc["input_ids"].shape[1] :]
            run.row_steps += new.numel()
            for row in new.tolist():
                row = row[: row.index(eos) + 1] if eos in row else row
                ids.append(row)
                tokens += len(strip(row, eos))  # a row cut by a stop string is padded with eos (= pad)
            tok.batch_decode(out, skip_special_tokens=True)
        return tokens, ids

    return run


def hand_pipeline(lm, prompts, max_new: int):
    """The per-prompt loop most comparison scripts use: pipeline("text-generation"), one prompt at a time."""
    from transformers import pipeline

    pipe = pipeline("text-generation", model=lm.model, tokenizer=lm.tokenizer, device=lm.device)
    eos = lm.tokenizer.eos_token_id

    def run():
        tokens = 0
        for p in prompts:
            text = pipe(p.prompt, max_new_tokens=max_new, do_sample=False, pad_token_id=eos, return_full_text=False)
            tokens += len(lm.tokenizer(text[0]["generated_text"])["input_ids"])
        return tokens, None

    return run


def environment(device: str, runtime: Runtime) -> dict:
    import transformers

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {
        "device": runtime.device_info,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "git_commit": commit or None,
        "git_dirty": bool(dirty),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def compare_generate(runtime, lm, model, args) -> dict:
    """vs_generate and vs_generate_mixed: the engine against the hand-written generate() loop."""
    out = {}
    cases = {
        "vs_generate": (uniform_prompts(args.prompts), ()),
        "vs_generate_mixed": (mixed_prompts(lm.tokenizer, args.prompts), (".",)),
        "vs_generate_ragged": (mixed_prompts(lm.tokenizer, args.prompts), (",",)),
    }
    for key, (prompts, stop) in cases.items():
        spec = job(model, prompts, batch_size=args.batch, max_new=args.new, stop=stop)
        batches = spec.model_copy(update={"generation": spec.generation.model_copy(update={"refill": False})})
        loop = hand_generate(lm, prompts, args.batch, args.new, stop=stop)
        sides = {
            "decodebench": ours(runtime, spec),
            "generate_loop": loop,
            "decodebench_refill_off": ours(runtime, batches),  # what continuous refill itself adds
        }
        stats, outputs = rounds(sides, args.rounds, runtime.device)
        eos = lm.tokenizer.eos_token_id
        tokens = sum(len(strip(row, eos)) for row in outputs["generate_loop"])
        refill = ratio(stats["decodebench"], stats["decodebench_refill_off"])
        # rows x steps the generate() loop computed per token it kept: the ratio of an engine that
        # computed full rows of kept tokens only, at the same cost per step (prefill aside)
        bound = round(loop.row_steps / tokens, 3)
        note = f"(refill vs batch after batch x{refill:.2f}; packing bound x{bound:.2f})"
        r, identical = against(key, stats, outputs, "generate_loop", "generate() loop", eos, note)
        out[key] = {
            "ratio": r,
            **stats,
            "identical_outputs": identical,
            "prompt_tokens": sorted({len(lm.tokenizer(p.prompt)["input_ids"]) for p in prompts}),
            "stop": list(stop),
            "refill_vs_batches": refill,
            "packing_bound": bound,
        }
    return out


def compare_beam(runtime, lm, model, args) -> dict:
    """beam_vs_generate: beam search in decodebench's beam loop against the hand-written generate() loop."""
    prompts, stop = mixed_prompts(lm.tokenizer, args.prompts), (",",)
    spec = job(model, prompts, "beam", {"num_beams": 4}, batch_size=args.beam_batch, max_new=args.new, stop=stop)
    sides = {
        "decodebench": ours(runtime, spec),
        "generate_loop": hand_generate(lm, prompts, args.beam_batch, args.new, stop=stop, num_beams=4),
    }
    stats, outputs = rounds(sides, args.rounds, runtime.device)
    note = f"(4 beams, batch {args.beam_batch}, stop ',')"
    eos = lm.tokenizer.eos_token_id
    r, identical = against("beam_vs_generate", stats, outputs, "generate_loop", "generate() loop", eos, note)
    return {"beam_vs_generate": {"ratio": r, **stats, "identical_outputs": identical, "stop": [","]}}


def pipeline_pair(runtime, model: str, args) -> dict:
    """One model: decodebench as a sweep runs it (batch_size: auto) against pipeline() one prompt at a time."""
    lm = runtime.cache.get(ModelSpec(path=model), runtime.device)
    prompts = uniform_prompts(args.pipeline_prompts)
    probe, _ = generate_job(job(model, prompts, batch_size="auto", max_new=args.new), runtime)  # probes once, untimed
    sides = {
        "decodebench": ours(runtime, job(model, prompts, batch_size="auto", max_new=args.new)),
        "pipeline_loop": hand_pipeline(lm, prompts, args.new),
    }
    stats, _ = rounds(sides, args.rounds, runtime.device)
    r = ratio(stats["decodebench"], stats["pipeline_loop"])
    name = f"vs_pipeline [{Path(model).name}, {lm.info['n_params'] / 1e6:.1f}M]"
    print(
        f"{name:24s} decodebench {stats['decodebench']['tokens_per_s']:9.1f} tok/s   "
        f"pipeline() per prompt {stats['pipeline_loop']['tokens_per_s']:9.1f} tok/s   x{r:.2f}"
    )
    used = probe.engine["batch_size"]
    return {"ratio": r, **stats, "model": model, "prompts": len(prompts), "decodebench_batch_size": used}


def compare_pipeline(runtime, lm, model, args) -> dict:
    """vs_pipeline on the benchmark's model; the other bundled models beside it under `by_model`."""
    main = pipeline_pair(runtime, model, args)
    others = {Path(m).name: pipeline_pair(runtime, m, args) for m in args.pipeline_also if Path(m) != Path(model)}
    return {"vs_pipeline": {**main, "by_model": {k: v["ratio"] for k, v in others.items()}, "others": others}}


def compare_auto(runtime, lm, model, args) -> dict:
    prompts = uniform_prompts(args.prompts)
    probe, _ = generate_job(job(model, prompts, batch_size="auto", max_new=args.new), runtime)  # probes once
    auto = probe.engine["batch_size"]
    sides = {"auto": ours(runtime, job(model, prompts, batch_size="auto", max_new=args.new))}
    for size in args.sizes:
        sides[f"batch_{size}"] = ours(runtime, job(model, prompts, batch_size=size, max_new=args.new))
    stats, _ = rounds(sides, args.rounds, runtime.device)
    best = max((k for k in stats if k != "auto"), key=lambda k: stats[k]["tokens_per_s"])
    r = ratio(stats["auto"], stats[best])
    print(
        f"{'auto_vs_best':24s} auto (batch {auto['used']}) {stats['auto']['tokens_per_s']:9.1f} tok/s   "
        f"best hand-picked ({best}) {stats[best]['tokens_per_s']:9.1f} tok/s   x{r:.2f}"
    )
    return {"auto_vs_best": {"ratio": r, "auto_batch_size": auto["used"], "probe": auto["auto"], "best": best, **stats}}


def compare_sampler(runtime, lm, model, args) -> dict:
    prompts = uniform_prompts(args.prompts)
    n = args.new  # min_new = max_new: both sides draw the same number of tokens
    sides = {
        "decodebench": ours(runtime, job(model, prompts, "top_p", {"p": 0.9}, args.batch, n, min_new=n)),
        "transformers": hand_generate(lm, prompts, args.batch, n, min_new=n, sample={"top_p": 0.9, "top_k": 0}),
    }
    stats, _ = rounds(sides, args.rounds, runtime.device)
    r = ratio(stats["decodebench"], stats["transformers"])
    print(
        f"{'sampler_vs_transformers':24s} seeded per generation {stats['decodebench']['tokens_per_s']:9.1f} tok/s   "
        f"transformers batch-wide {stats['transformers']['tokens_per_s']:9.1f} tok/s   x{r:.2f}"
    )
    return {"sampler_vs_transformers": {"ratio": r, **stats}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "examples/models/austen-small"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--pipeline-prompts", type=int, default=128)
    ap.add_argument(
        "--pipeline-also",
        nargs="*",
        default=[str(REPO / "examples/models/austen-tiny")],
        help="other models for vs_pipeline, reported under details.vs_pipeline.by_model",
    )
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--beam-batch", type=int, default=8, help="prompts per batch of beam_vs_generate (x 4 beams)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a smoke run: few prompts, tokens and rounds")
    ap.add_argument("--gpu-minutes", type=float, default=4.0, help="time budget of the GPU section")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results.json"))
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.pipeline_prompts, args.new, args.rounds, args.sizes = 8, 4, 8, 1, [4, 8]
    configure(level="warning")
    runtime = Runtime(args.device)
    lm = runtime.cache.get(ModelSpec(path=args.model), runtime.device)
    generate_job(job(args.model, uniform_prompts(4), max_new=4), runtime)  # warm-up
    print(
        f"model {args.model} ({lm.info['n_params']:,} params) on {runtime.device}, torch {torch.__version__}; "
        f"{args.prompts} prompts x {args.new} new tokens, batch {args.batch}, "
        f"median of {args.rounds} interleaved rounds"
    )
    from benchmarks.transformers_cb import compare_cb

    sections = [compare_generate, compare_beam, compare_pipeline, compare_auto, compare_sampler]
    if runtime.device.type == "cuda":
        sections.append(gpu)
    sections.append(compare_cb)  # last: another library's baseline, the likeliest to fail on another release
    results: dict = {}
    env = environment(args.device, runtime)  # before the first write: the commit and tree the run measures
    for section in sections:  # the file is rewritten after each: a run cut short keeps what it measured
        results.update(section(runtime, lm, args.model, args))
        ratios = write_report(args, env, results, complete=section is sections[-1])
    print("ratios (> 1: decodebench faster): " + ", ".join(f"{k} {v or float('nan'):.2f}" for k, v in ratios.items()))
    print(f"wrote {args.out}")


def gpu(runtime, lm, model, args) -> dict:
    """The GPU section (benchmarks/throughput_gpu.py), on a CUDA device only."""
    from benchmarks.throughput_gpu import gpu_section

    budget = args.gpu_minutes * 60
    return {"gpu": gpu_section(runtime, model, uniform_prompts(16), budget, auto_prompts=uniform_prompts(128))}


def write_report(args, env: dict, results: dict, complete: bool) -> dict:
    """benchmarks/results.json (or --out) from the sections so far; the ratios."""
    details = {k: v for k, v in results.items() if k != "gpu"}
    ratios = {k: v["ratio"] for k, v in details.items()}
    report = {**ratios, "details": details, "settings": vars(args), **env}
    report.update({"gpu": results["gpu"]} if "gpu" in results else {})
    report["complete"] = complete  # False: a run cut short (e.g. by scripts/device-checks.sh's time limit)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return ratios


if __name__ == "__main__":
    main()
