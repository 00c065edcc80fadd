"""The static, bucketed decode step (worker.engine.graphs) on the CPU, where it runs eagerly.

- Every golden case (greedy, sampling, penalties, stop strings, contrastive, beam and diverse beam search,
  streams and batches, on both bundled models) gives the recorded tokens with `decode_step: static`; the
  cases whose step cannot be static (eager attention: no prepared mask) say why in result.json.
- The step's logits equal the eager step's over a twin cache (padding rows in a bucket, compaction into a
  smaller bucket, buffers that grew: the graphs dropped and captured again, a step with no column left run
  eagerly).
- The step's forward is capturable: torch.compile(fullgraph=True) traces it whole (no host synchronisation, no
  Python branch on a tensor's value: either would break the graph), one token a row and contrastive search's
  candidates, on GPT-2 and Llama.
- The capture's bookkeeping, with a CPU stand-in of torch.cuda's graphs (`ReplayedOnCpu`: a capture keeps
  the step, a replay runs it again into the same output tensor): one capture per bucket, replays after it,
  a bucket whose capture fails runs eagerly, and the tokens stay the eager loop's. The real capture runs in
  tests/gpu/test_graphs_cuda.py on a lent GPU (scripts/device-checks.sh).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.engine import MIXED, job, with_generation
from tests.unit.worker.engine.golden import record as golden
from worker.engine import graphs
from worker.engine import plan as planning
from worker.engine.call import ModelCall
from worker.engine.graphs import bucket, bucket_sizes
from worker.engine.job import generate_job
from worker.engine.plan import Cache, DecodeStep, decode_step_of
from worker.engine.rows import Ends, Rows

pytestmark = pytest.mark.timeout(180)


class ReplayedOnCpu:
    """A stand-in of graphs.CudaCapture on the CPU: `capture` runs the step once and keeps it, a replay runs it
    again into the same output tensor; a bucket in `refuse` fails its capture as a synchronising op would."""

    captures: list[int] = []

    def __init__(self, refuse: frozenset[int] = frozenset()) -> None:
        self.refuse = refuse

    def warm(self, run):
        return run()

    def capture(self, run):
        outputs = run()
        ReplayedOnCpu.captures.append(outputs[0].shape[0])
        if outputs[0].shape[0] in self.refuse:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

        def replay() -> None:
            for out, again in zip(outputs, run()):
                out.copy_(again)

        return replay, outputs, 0


def test_buckets_are_vllms_capture_sizes_capped_at_the_buffers_rows():
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(5) == (1, 2, 4, 5)
    assert bucket_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert bucket_sizes(33) == (1, 2, 4, 8, 16, 24, 32, 33)
    for rows in range(1, 70):
        sizes = bucket_sizes(rows)
        for n in range(1, rows + 1):
            assert bucket(n, rows) == min(b for b in sizes if b >= n)
    with pytest.raises(ValueError, match="9 live rows in buffers of 8"):
        bucket(9, 8)


def test_the_plan_takes_the_static_step_only_where_it_can_and_says_why(monkeypatch):
    from worker.engine.choose import Chooser
    from worker.engine.loops.beam_step import BeamStep
    from worker.engine.loops.contrastive import ContrastiveStep

    class OwnPass(Chooser):
        def forward_of(self, call):
            return call.eager_forward

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    pre = Cache.PREALLOCATED
    assert decode_step_of("auto", cpu, Chooser, pre, True)[0] is DecodeStep.EAGER
    step, why = decode_step_of("auto", cuda, Chooser, pre, True)  # opt-in until a GPU run has checked them
    assert step is DecodeStep.EAGER and "decode_step: graphs" in why
    assert decode_step_of("graphs", cuda, Chooser, pre, True) == (DecodeStep.GRAPHS, "decode_step: graphs")
    assert decode_step_of("graphs", cuda, BeamStep, pre, True)[0] is DecodeStep.GRAPHS
    assert decode_step_of("graphs", cuda, ContrastiveStep, pre, True)[0] is DecodeStep.GRAPHS  # over its rows' cache
    assert decode_step_of("graphs", cuda, ContrastiveStep, Cache.DYNAMIC, False)[0] is DecodeStep.EAGER  # repeated
    assert decode_step_of("static", cuda, Chooser, pre, True)[0] is DecodeStep.STATIC
    step, why = decode_step_of("graphs", cpu, Chooser, pre, True)
    assert step is DecodeStep.STATIC and "no CUDA" in why
    assert decode_step_of("eager", cuda, Chooser, pre, True) == (DecodeStep.EAGER, "decode_step: eager")
    for refused in [
        (None, pre, True),  # generate() runs it
        (Chooser, Cache.DYNAMIC, False),  # a sliding-window model: transformers' cache
        (Chooser, pre, False),  # no prepared mask
        (OwnPass, pre, True),  # a plugin's pass of its own
    ]:
        step, why = decode_step_of("graphs", cuda, *refused)
        assert step is DecodeStep.EAGER and why
    monkeypatch.setattr(planning, "GRAPHS_BY_DEFAULT", True)
    assert decode_step_of("auto", cuda, Chooser, pre, True) == (
        DecodeStep.GRAPHS,
        "CUDA graphs, one per bucket of rows",
    )


@pytest.mark.parametrize("model", sorted(golden.MODELS))
def test_every_golden_case_gives_its_recorded_tokens_on_the_static_step(model, runtime):
    recorded = json.loads(golden.GOLDEN.read_text())[model]
    for case, strategy, params, settings, options in golden.CASES:
        spec = with_generation(
            golden.job(golden.MODELS[model], strategy, params, settings, options), decode_step="static"
        )
        result, records = generate_job(spec, runtime)
        assert [r.token_ids for r in records] == recorded[case], case
        step = result.engine["decode_step"]
        if options.get("attention") == "eager":  # no prepared mask: contrastive's candidates repeat the cache
            assert step["mode"] == "eager" and step["why"], case
            assert "static_steps" not in step and all(b.decode_step is None for b in result.batches)
        else:
            assert step["mode"] == result.engine["plan"]["decode_step"] == "static", case
            assert step["static_steps"] > 0 and step["eager_steps"] == 0 and step["graph_replays"] == 0, case


def test_payloads_and_result_json_of_the_eager_step_are_as_before_it(tiny_model):
    """A job that leaves decode_step alone serialises without it (the same signed payload an older worker takes),
    a batch of the eager step without its `decode_step`; set, both travel."""
    from worker.core.contract import JobSpec
    from worker.core.results import BatchTiming

    spec = job(tiny_model, max_new=4)
    assert "decode_step" not in spec.model_dump_json()
    graphed = with_generation(spec, decode_step="graphs")
    assert JobSpec.model_validate_json(graphed.model_dump_json()).generation.decode_step == "graphs"
    timing = BatchTiming(n=1, batch_size=1, input_tokens=1, new_tokens=1, prefill_s=0, total_s=0, decode_s=0)
    assert "decode_step" not in timing.model_dump_json()
    stepped = timing.model_copy(update={"decode_step": {"mode": "static"}})
    assert BatchTiming.model_validate_json(stepped.model_dump_json()).decode_step == {"mode": "static"}


def test_the_default_on_the_cpu_is_the_eager_step_and_result_json_says_why(tiny_model, runtime):
    result, _ = generate_job(job(tiny_model, max_new=4), runtime)
    assert result.engine["plan"]["decode_step"] == "eager"
    assert result.engine["decode_step"] == {
        "mode": "eager",
        "why": "on the CPU the eager step (no launches to save; the window only)",
    }
    assert all(b.decode_step is None for b in result.batches)


def _rows(tok, prompts, max_new):
    enc = tok(prompts, return_tensors="pt", padding=True)
    return Rows(enc["input_ids"], enc["attention_mask"], Ends([], tok.pad_token_id, max_new))


def test_the_static_steps_logits_are_the_eager_steps_through_buckets_growth_and_compaction(tiny_model, monkeypatch):
    monkeypatch.setattr(graphs, "CudaCapture", ReplayedOnCpu)
    ReplayedOnCpu.captures = []
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    prompts = ["Anne", "It was a truth universally acknowledged, that a single man", "She had never seen"]
    static = ModelCall.of(model, mask=True, preallocated=True, step=DecodeStep.GRAPHS)
    eager = ModelCall.of(model, mask=True, preallocated=True)
    a, b = _rows(tok, prompts, 8), _rows(tok, prompts, 8)
    cache_a = static.buffers(a.width + 2, 3)  # two columns: the third step has none left (the buffers grow)
    cache_b = eager.buffers(a.width + 8, 3)
    with torch.inference_mode():
        out_a, _ = static.prefill(a, cache_a)
        out_b, _ = eager.prefill(b, cache_b)
        for step in range(8):
            nxt = out_b.logits[:, -1].argmax(-1)
            a.append(nxt)
            b.append(nxt)
            if step == 5:  # compaction: rows 0 and 2 stay, and move to the 2-row bucket
                keep = torch.tensor([0, 2])
                a.keep(keep, cache_a, None)
                b.keep(keep, cache_b, None)
            out_a, _ = static.forward(a, cache_a)
            out_b, _ = eager.forward(b, cache_b)
            assert out_a.logits.shape == out_b.logits.shape
            torch.testing.assert_close(out_a.logits, out_b.logits, rtol=0, atol=1e-4)
    stats = static.step_stats()
    assert stats.eager == 1  # step 2: no column left; the eager forward grew the buffers
    assert stats.recaptures == 1  # step 3: new buffers, the 3-row graph captured again
    assert stats.steps == 7 and stats.buckets == {2, 3}
    # captured at a bucket's second step: 3 rows at steps 1 and 4 (the buffers grew at step 2), 2 rows at step 6
    assert ReplayedOnCpu.captures == [3, 3, 2] and stats.captured == 3
    assert stats.replays == 1  # step 7; steps 0, 3, 5 (first uses) and 1, 4, 6 (captures) ran eagerly
    assert eager.step_stats() is None


def test_a_paused_clock_leaves_the_capture_out_of_every_later_stamp(monkeypatch):
    from worker.engine import timing

    stamps = iter([0.0, 1.0, 2.0, 12.0, 13.0, 14.0, 15.0])  # start, tick, pause (10 s), tick, mark, stop
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(stamps))
    clock = timing.StepClock(torch.device("cpu"))
    clock.start()
    clock.tick()
    with clock.paused():
        pass
    clock.tick()
    clock.mark()
    times = clock.stop()
    assert times.step_s == [1.0, 3.0] and times.marks == [0.0, 4.0] and times.total_s == 5.0


def _llama(tiny_model):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=4096, attn_implementation="sdpa")  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_static_steps_forward_traces_as_one_graph(tiny_model, monkeypatch, family):
    """What CUDA graphs need of the step, checked where there is no CUDA: dynamo traces the model's forward over
    the bucket's inputs whole (fullgraph), as it refuses a synchronisation or a branch on a tensor's value."""
    if family == "gpt2":
        model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa").eval()
    else:
        model = _llama(tiny_model)
    compiled = torch.compile(graphs.StaticStep._forward, backend="eager", fullgraph=True)
    traced: list[tuple[int, int]] = []

    def whole(self, cache, entry):
        traced.append(tuple(entry.ids.shape))
        return compiled(self, cache, entry)

    monkeypatch.setattr(graphs.StaticStep, "_forward", whole)
    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    call = ModelCall.of(model, mask=True, preallocated=True, step=DecodeStep.STATIC)
    rows = _rows(tok, ["Anne", "It was a truth universally acknowledged", "She"], 8)
    cache = call.buffers(rows.width + 8, 3)
    with torch.inference_mode():
        out, _ = call.prefill(rows, cache, output_hidden_states=True)  # as contrastive search's prefill asks
        rows.append(out.logits[:, -1].argmax(-1))
        out, _ = call.forward(rows, cache)  # one token a row
        logits, hidden = call.candidates(cache, rows.attn, out.logits[:, -1].topk(3).indices)  # k = 3 a row
    assert traced == [(3, 1), (3, 3)] and logits.shape[:2] == (3, 3) and hidden.shape[:2] == (3, 3)
    assert call.step_stats().eager == 0


def test_a_static_step_keeps_no_cache_alive(tiny_model):
    """The batch-size probe runs one model call over cache after cache: each goes when the probe lets it go."""
    import gc
    import weakref

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    call = ModelCall.of(model, mask=True, preallocated=True, step=DecodeStep.STATIC)
    gone = []
    for _ in range(3):
        rows = _rows(tok, ["Anne", "She had never seen"], 4)
        cache = call.buffers(rows.width + 4, 2)
        with torch.inference_mode():
            call.prefill(rows, cache)
            rows.append(torch.tensor([5, 6]))
            call.forward(rows, cache)
        assert call.step_stats().steps >= 1
        gone.append(weakref.ref(cache))
        del cache
        gc.collect()
    assert all(ref() is None for ref in gone) and call.step_stats() is None


def _graphed(monkeypatch, refuse=frozenset()):
    """Plans take CUDA graphs on the CPU, captured by the stand-in."""
    monkeypatch.setattr(graphs, "CudaCapture", lambda: ReplayedOnCpu(refuse))
    real = planning.decode_step_of

    def graphed(setting, device, step, cache, mask):
        found, why = real("static", device, step, cache, mask)
        return (DecodeStep.GRAPHS, "the CPU stand-in") if found is DecodeStep.STATIC else (found, why)

    monkeypatch.setattr(planning, "decode_step_of", graphed)


@pytest.mark.parametrize(
    "strategy,params,refuse",
    [
        ("top_p", {"p": 0.9}, frozenset()),
        ("top_p", {"p": 0.9}, frozenset({2})),
        ("contrastive", {"k": 3, "alpha": 0.6}, frozenset()),  # k candidate tokens a row, and hidden states
    ],
)
def test_a_stream_captures_each_bucket_once_replays_it_and_keeps_the_eager_tokens(
    tiny_model, runtime, monkeypatch, strategy, params, refuse
):
    spec = job(tiny_model, strategy, params, batch_size=4, max_new=20, stop=[","], prompts=MIXED, seed=3)
    _, eager = generate_job(spec, runtime)
    _graphed(monkeypatch, refuse)
    ReplayedOnCpu.captures = []
    # no warm-up: it runs once per code path (Plan.warm_key), and would capture its own graphs on this new one
    spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"warmup": False})})
    from worker.engine import timing

    paused, real = [], timing.StepClock.paused
    monkeypatch.setattr(timing.StepClock, "paused", lambda self: paused.append(1) or real(self))
    result, graphed = generate_job(spec, runtime)
    assert len(paused) == len(ReplayedOnCpu.captures) > 0  # the loop's clock left every capture out
    assert [(r.token_ids, r.stop_reason) for r in graphed] == [(r.token_ids, r.stop_reason) for r in eager]
    step = result.engine["decode_step"]
    assert step["mode"] == "graphs" and step["eager_steps"] == 0 and step["recaptures"] == 0
    assert len(step["buckets"]) >= 2  # rows finishing at different steps move between buckets
    failed = {str(b) for b in refuse if b in step["buckets"]}
    assert set(step["capture_failed"]) == failed
    assert all("not permitted when stream is capturing" in why for why in step["capture_failed"].values())
    assert step["graphs_captured"] == len(ReplayedOnCpu.captures) - len(failed) <= len(step["buckets"]) - len(failed)
    assert 0 < step["graph_replays"] < step["static_steps"] and step["capture_s"] > 0


def test_the_benchmark_runs_its_sides_on_the_cpu_and_writes_their_ratio(tmp_path):
    """benchmarks/bench_graphs.py at its CPU smoke size (tiny configs; the eager and static sides): the code a
    lent GPU's few minutes run has run here first. In float32, where the steps' greedy tokens are identical: in
    bfloat16 the tiny llama's static step picked another token in 1 generation of 64 at batch 4 and 16, and the CPU's
    auto batch size is the fastest in a timed probe, 16 on a loaded machine (a failed run, 2026-12-07)."""
    import subprocess
    import sys

    out = tmp_path / "graphs.json"
    cmd = [sys.executable, "benchmarks/bench_graphs.py", "--device", "cpu", "--tiny", "--rounds", "1"]
    cmd += ["--batches", "1,auto", "--max-new", "6", "--dtype", "float32", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [("gpt2", 1), ("llama", 1), ("gpt2", "auto"), ("llama", "auto")]
    for row in rows:
        assert set(row["sides"]) == {"eager", "static", "hf-static"} and row["static/eager"] > 0
        assert row["static/hf-static"] > 0 and row["identical_to_eager"]["static"] == 1.0
        assert row["sides"]["static"]["decode_step"]["mode"] == "static"
        assert row["sides"]["eager"]["decode_step"]["mode"] == "eager"
