"""The own engine's decode step eager, static and captured as CUDA graphs, against transformers' compiled
static-cache path, side by side in one run (issue 44; docs/performance.md#cuda-graphs).

For each model (`gpt2`: GPT-2 124M from GPT2Config, `llama`: a ~1.1B Llama built from a LlamaConfig shaped
like TinyLlama's; random weights in bfloat16 (or `--dtype`) with the bundled tokenizer: the speed does not depend
on the weights) and batch size (1, 8, 32 and auto), greedy search over the same prompts, every generation forced to
`--max-new` tokens (min_new_tokens = max_new_tokens), on these sides:

- `eager`: the own engine, `decode_step: eager` (a forward over each layer's window, every step);
- `static`: the own engine, `decode_step: static` (the bucketed static step, run eagerly);
- `graphs`: the own engine, `decode_step: graphs` (the static step captured as CUDA graphs; CUDA only);
- `vllm`: vLLM on the same job (the engine axis), with its own CUDA graphs on a GPU, where vLLM is installed
  (a vLLM image or .venv-vllm; the lent device machines have none);
- `hf-compiled`: transformers' `generate(cache_implementation="static")`, which compiles the forward pass
  with torch.compile on CUDA (compiled in an untimed warm-up per batch size); on the CPU, where transformers
  does not compile it, the side is `hf-static`.

Each side runs once untimed, then the rounds interleave the sides (benchmarks/sides.py); a ratio is the
median of the rounds' ratios of tokens/s. Printed per model and batch: tokens/s and ms per decode step per
side, graphs / eager, graphs / hf-compiled, static / eager, whether greedy tokens are identical across the
sides, and at batch 1 each side's fraction of the memory-bandwidth bound (weight bytes x tokens/s /
bandwidth). The targets (issue 44): batch 1 at least 5x eager; no slower than hf-compiled at any batch.

    python benchmarks/bench_graphs.py --device cuda:0 [--models gpt2,llama] [--rounds 3] [--out FILE]
    python benchmarks/bench_graphs.py --device cpu --tiny --dtype float32  # the CPU: eager, static, hf-static

Greedy tokens are identical across the own engine's steps in float32 (tests/unit/worker/engine/test_graphs.py). In
bfloat16 a step that computes the same logits in another order (the static step's padded attention, another batch
size) may pick the other of two tokens whose logits round alike: on the tiny random llama at batch 4 or 16 of 64
prompts, 1 generation of 64 differs from the eager step's (none in float32), so the CPU smoke test reads identity in
float32, where a difference is a bug.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.jobs import job  # noqa: E402
from benchmarks.sides import ratio, rounds, uniform_prompts  # noqa: E402
from benchmarks.throughput_gpu import memory_bandwidth  # noqa: E402
from worker.engine.job import Runtime, generate_job  # noqa: E402

TOKENIZER = str(REPO / "examples/models/austen-tiny")
SHAPES = {  # (family, config sizes); --tiny: a few layers, for the CPU
    "gpt2": ("gpt2", {}),
    "llama": (
        "llama",
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=2048,
        ),
    ),
}
# head size 32: vLLM's CPU attention takes 32, 64, ... (the vllm side in .venv-vllm)
TINY = {"gpt2": dict(n_embd=64, n_layer=2, n_head=2), "llama": dict(hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=4096)}  # fmt: skip


def build(folder: Path, family: str, tiny: bool, device, dtype: str = "bfloat16") -> tuple[str, int]:
    """A random-weight model of the family in `dtype` (built on the device), with the bundled tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    shape = TINY[family] if tiny else SHAPES[family][1]
    config = AutoConfig.for_model(SHAPES[family][0], bos_token_id=0, eos_token_id=0, pad_token_id=0, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(folder)
    return str(folder), sum(p.numel() * p.element_size() for p in model.parameters())


def own(runtime: Runtime, model: str, prompts, batch, max_new: int, step: str, dtype: str = "bfloat16"):
    spec = job(model, prompts, "greedy", {}, batch, max_new, min_new=max_new, dtype=dtype, decode_step=step)
    found: dict = {}

    def run():
        result, records = generate_job(spec, runtime)
        steps = sum(max((b.steps or 1) - 1, 0) for b in result.batches)
        found.update(
            ms_per_step=round(sum(b.decode_s for b in result.batches) * 1000 / steps, 3) if steps else None,
            decode_step=result.engine["decode_step"],
            batch_size=result.engine["batch_size"]["used"],
        )
        return result.new_tokens, [r.token_ids for r in records]

    return run, found


def vllm(runtime: Runtime, model: str, prompts, batch, max_new: int, dtype: str = "bfloat16"):
    """vLLM on the same job (the sweep's engine axis, worker.engine.vllm), with its CUDA graphs on a GPU
    (`enforce_eager: false`): one sequence at a time at batch 1, else at most the batch (auto: 64)."""
    from worker.core.engines import VllmEngine
    from worker.engine.job import engine_generate

    cuda = runtime.device.type == "cuda"
    engine = VllmEngine(
        name="vllm",
        dtype=dtype,
        max_model_len=512,
        max_num_seqs=64 if batch == "auto" else batch,
        enforce_eager=not cuda,
        **({} if cuda else {"kv_cache_space_gb": 1}),
    )
    spec = job(model, prompts, "greedy", {}, batch, max_new, min_new=max_new, dtype=dtype)
    spec = spec.model_copy(update={"engine": engine})

    def run():
        result, records = engine_generate(spec, runtime)
        return result.new_tokens, [r.token_ids for r in records]

    return run, {}


def hf_compiled(model_path: str, prompts, batch, max_new: int, device, dtype: str = "bfloat16"):
    """transformers' generate() with its static cache (torch.compile of the forward on CUDA), in batches."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device).eval()
    tok = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    size = len(prompts) if batch == "auto" else batch
    texts = [p.prompt for p in prompts]

    def run():
        tokens, ids = 0, []
        for i in range(0, len(texts), size):
            enc = tok(texts[i : i + size], return_tensors="pt", padding=True).to(device)
            out = model.generate(
                **enc, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                cache_implementation="static", pad_token_id=tok.pad_token_id,
            )  # fmt: skip
            new = out[:, enc["input_ids"].shape[1] :]
            tokens += new.numel()
            ids += new.tolist()
        return tokens, ids

    return run, {}


def section(args, runtime, family: str, batch) -> dict:
    device = runtime.device
    n = 64 if batch == "auto" else max(2 * batch, 4)
    prompts = uniform_prompts(n)
    folder = Path(tempfile.mkdtemp(prefix=f"decodebench-{family}-"))
    try:
        path, weight_bytes = build(folder, family, args.tiny, device, args.dtype)
        sides, found = {}, {}
        steps = ["eager", "static"] + (["graphs"] if device.type == "cuda" else [])
        for step in steps:
            sides[step], found[step] = own(runtime, path, prompts, batch, args.max_new, step, args.dtype)
        if _has_vllm() and not args.no_vllm:
            sides["vllm"], found["vllm"] = vllm(runtime, path, prompts, batch, args.max_new, args.dtype)
        if not args.no_hf:  # compiled on CUDA; on the CPU transformers runs its static cache uncompiled
            hf = "hf-compiled" if device.type == "cuda" else "hf-static"
            sides[hf], found[hf] = hf_compiled(path, prompts, batch, args.max_new, device, args.dtype)
        for run in sides.values():  # untimed: loading, warm-up, compilation
            run()
        stats, outputs = rounds(sides, args.rounds, device)
        bandwidth, _ = memory_bandwidth(device)
        row = {"model": family, "batch": batch, "prompts": n, "weight_bytes": weight_bytes, "sides": {}}
        for name, s in stats.items():
            side = {**s, **{k: v for k, v in found[name].items() if k != "decode_step"}}
            if batch == 1 and bandwidth:
                side["bandwidth_bound_fraction"] = round(weight_bytes * s["tokens_per_s"] / bandwidth, 4)
            if "decode_step" in found[name]:
                side["decode_step"] = found[name]["decode_step"]
            row["sides"][name] = side
        base = outputs["eager"]
        row["identical_to_eager"] = {k: sum(a == b for a, b in zip(v, base)) / len(base) for k, v in outputs.items()}
        pairs = [("graphs", "eager"), ("graphs", "hf-compiled"), ("graphs", "vllm"), ("static", "eager")]
        pairs += [("eager", "hf-compiled"), ("eager", "vllm")]
        for a, b in pairs + [("static", "hf-static")]:
            if a in stats and b in stats:
                row[f"{a}/{b}"] = ratio(stats[a], stats[b])
        return row
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--batches", default="1,8,32,auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="tiny configs (the code path on the CPU)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--no-hf", action="store_true", help="leave out transformers' compiled path")
    parser.add_argument("--no-vllm", action="store_true", help="leave out vLLM (a side where it is installed)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no section after this many seconds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runtime = Runtime(args.device)
    started = time.perf_counter()
    out = {"device": str(runtime.device), "dtype": args.dtype, "max_new": args.max_new, "rounds": args.rounds}
    out |= {"rows": [], "skipped": []}
    # batch-major: a run cut short by its budget has measured every model at the smaller batches
    for batch in [b if b == "auto" else int(b) for b in args.batches.split(",")]:
        for family in args.models.split(","):
            if time.perf_counter() - started > args.budget_s:
                out["skipped"].append(f"{family}@{batch}")
                continue
            row = section(args, runtime, family, batch)
            out["rows"].append(row)
            sides = "  ".join(
                f"{k} {v['tokens_per_s']:.0f} tok/s {v.get('ms_per_step') or '-'} ms/step"
                for k, v in row["sides"].items()
            )
            ratios = "  ".join(f"{k} x{v:.2f}" for k, v in row.items() if "/" in k)
            print(f"{family}@{batch}: {sides}  |  {ratios}  |  identical {row['identical_to_eager']}", flush=True)
            if args.out:  # rewritten after each section: a run cut short keeps what it measured
                args.out.write_text(json.dumps(out, indent=1) + "\n")
    out["seconds"] = round(time.perf_counter() - started, 1)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
