"""The cost of a decode step the first time its shapes are seen, on a CUDA device, by SDPA backend.

The GPU section of bench_throughput.py measured (H200, torch 2.11, GPT-2 124M in bfloat16) the
first strategy at each batch shape several times slower per decode step than the next one at the
same shapes (greedy@auto 78 ms, then top_p@auto 7.4 ms). A decode step's attention has a new key
length every step, so a backend that builds a plan per shape (cuDNN's fused attention) pays at
every step of a shape it has not seen. This runs greedy twice at batch 1 and at batch 128 in one
process, with the cuDNN SDPA backend on or off (`--cudnn`), and prints ms per decode step of each
pass, and the backend SDPA picks for a decode step's shapes. Run it once per setting, each in a
fresh process: the first pass is the cold one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.jobs import job
from benchmarks.sides import uniform_prompts
from benchmarks.throughput_gpu import build_model
from worker.engine.job import Runtime, generate_job

EXAMPLES = Path(__file__).resolve().parents[1] / "examples/models"


def sdpa_choice(device) -> str:
    """The backend SDPA picks for one decode step (128 rows, 12 heads, one query, 200 keys, a boolean mask)."""
    q = torch.randn(128, 12, 1, 64, device=device, dtype=torch.bfloat16)
    k = torch.randn(128, 12, 200, 64, device=device, dtype=torch.bfloat16)
    mask = torch.ones(128, 1, 1, 200, device=device, dtype=torch.bool)
    try:
        chosen = torch._fused_sdp_choice(q, k, k, mask)
        return str(torch.nn.attention.SDPBackend(chosen).name)
    except Exception as e:  # a private helper: the run goes on without it
        return f"unknown ({type(e).__name__})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cudnn", choices=["on", "off"], default="on")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.backends.cuda.enable_cudnn_sdp(args.cudnn == "on")
    runtime = Runtime(args.device)
    folder = Path(tempfile.mkdtemp(prefix="decodebench-sdpa-"))
    rows: dict[str, dict] = {}
    try:
        model, _ = build_model(folder, str(EXAMPLES / "austen-tiny"))
        for run in ("cold", "warm"):
            for batch, n in ((1, 16), (128, 128)):
                spec = job(
                    model,
                    uniform_prompts(n),
                    "greedy",
                    {},
                    batch,
                    args.new,
                    min_new=args.new,
                    dtype="bfloat16",
                    warmup=True,
                )
                start = time.perf_counter()
                result, _ = generate_job(spec, runtime)
                steps = sum(max((b.steps or 1) - 1, 0) for b in result.batches)
                row = {
                    "ms_per_step": round(sum(b.decode_s for b in result.batches) * 1000 / max(steps, 1), 3),
                    "tokens_per_s": round(result.new_tokens / sum(b.total_s for b in result.batches), 1),
                    "job_s": round(time.perf_counter() - start, 2),
                }
                rows[f"greedy@{batch} {run}"] = row
                print(f"cudnn_sdp={args.cudnn} greedy@{batch:<4} {run}: {row}", flush=True)
        out = {
            "cudnn_sdp": args.cudnn,
            "sdpa_choice": sdpa_choice(runtime.device),
            "torch": torch.__version__,
            "device": runtime.device_info.get("name", str(runtime.device)),
            "rows": rows,
        }
        print(f"cudnn_sdp={args.cudnn}: SDPA picks {out['sdpa_choice']} for a decode step's shapes")
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
