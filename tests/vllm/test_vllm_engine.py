"""The vLLM engine on the bundled models (issue 26). Runs in .venv-vllm (scripts/setup-vllm.sh):
the main suite runs this file there through tests/vllm/test_vllm_env.py; in an environment without vLLM
it is skipped. vLLM starts slowly on the CPU, so the tests share the runtime's LLM (the same engine
settings throughout, so its cache keeps it) and run in the order of the LLM they need: every test of
plain vLLM first, then those of typical, epsilon and eta, whose LLM has decodebench's logits processor
(vllm.LLM(logits_processors=...)), last: each LLM starts once."""

from __future__ import annotations

import json

import pytest

vllm = pytest.importorskip("vllm")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from controller.sweep.load import parse_spec  # noqa: E402
from controller.sweep.plan import plan  # noqa: E402
from tests.support.services import TINY_MODEL  # noqa: E402
from tests.support.vllmjobs import ENGINE, HELD_OUT, jobs_of  # noqa: E402
from worker.core.contract import StrategySpec  # noqa: E402
from worker.core.errors import PermanentJobError  # noqa: E402
from worker.engine.job import Runtime, run_job  # noqa: E402
from worker.engine.vllm.agreement import (  # noqa: E402
    filtered_probs,
    g_test,
    g_test_pairs,
    next_token_logits,
    second_token_probs,
)
from worker.engine.vllm.llm import LLMCache  # noqa: E402
from worker.engine.vllm.logitsprocs import KINDS  # noqa: E402
from worker.engine.vllm.params import sampling_params, sampling_settings  # noqa: E402
from worker.engine.vllm.run import generate_job  # noqa: E402
from worker.store import open_store  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runtime():
    return Runtime("cpu")


@pytest.fixture(scope="module")
def hf():
    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()
    return model, tok


def llm_for(runtime, job, strategy: str):
    """The runtime's LLM for `job`'s model and engine, with the logits processor where `strategy` needs it."""
    if getattr(runtime, "vllm", None) is None:
        runtime.vllm = LLMCache()
    return runtime.vllm.get(job.model, job.engine, "cpu", filters=strategy in KINDS).llm


def texts(job, runtime, check=True):
    result, records = generate_job(job, runtime, check=check)
    return result, {r.prompt_id: r for r in records}


def test_greedy_is_token_identical_to_transformers(runtime, hf):
    model, tok = hf
    (job,) = jobs_of([{"name": "greedy"}])
    result, records = texts(job, runtime)
    for p in HELD_OUT:
        enc = tok(p["prompt"], return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=False, max_new_tokens=32, pad_token_id=0)
        expected = out[0, enc["input_ids"].shape[1] :].tolist()
        got = records[p["id"]].token_ids
        assert got == expected[: len(got)] and (len(got) == 32 or expected[len(got)] == 0), p["id"]
    # what vLLM applied is recorded, and the speed columns come from its request clocks
    assert result.engine["name"] == "vllm" and result.engine["vllm"] == vllm.__version__
    assert result.engine["llm"]["dtype"] == "float32" and result.engine["llm"]["max_model_len"] == 256
    assert result.engine["sampling_params"]["temperature"] == 0.0
    assert result.engine["kv_cache"]["block_size"] and result.engine["kv_cache"]["num_blocks"]
    assert result.provenance["vllm"] == vllm.__version__
    (timing,) = result.batches
    assert len(timing.ttft_s) == len(timing.latency_s) == len(HELD_OUT)
    assert all(0 < t <= lat for t, lat in zip(timing.ttft_s, timing.latency_s))


def test_seeded_sampling_is_reproducible_across_runs_and_batch_compositions(runtime):
    strategy = [{"name": "top_p", "params": {"p": 0.9}}]
    (whole,) = jobs_of(strategy)
    result, first = texts(whole, runtime)
    assert result.engine["distribution_check"]["draws"] == 1000  # the report's check, run once here
    _, again = texts(whole, runtime, check=False)
    assert {k: r.token_ids for k, r in first.items()} == {k: r.token_ids for k, r in again.items()}
    few = [HELD_OUT[5], HELD_OUT[2]]
    (part,) = jobs_of(strategy, prompts=few)
    _, alone = texts(part, runtime, check=False)
    for p in few:
        assert alone[p["id"]].token_ids == first[p["id"]].token_ids
        assert alone[p["id"]].seed == first[p["id"]].seed
    assert len({tuple(r.token_ids) for r in first.values()}) > 1


def test_samples_are_vllms_parallel_sampling_each_with_its_seed_and_clock(runtime):
    """`samples: 3` is three requests a prompt, as SamplingParams(n=3) makes them: three records a prompt, sample i
    seeded with the prompt's seed + i (as vLLM seeds its child requests), sample 0 the generation of the same job
    without samples, reproducible with other prompts beside it. Each sample has its own latency, TTFT and TPOT, as
    on the own engine: SamplingParams(n) gave one a prompt, its last sample's."""
    few = HELD_OUT[:4]
    (plain,) = jobs_of([{"name": "top_p", "params": {"p": 0.9}}], prompts=few)
    (sampled,) = jobs_of([{"name": "top_p", "params": {"p": 0.9}, "samples": 3}], prompts=few)
    unsampled, alone = texts(plain, runtime, check=False)
    result, records = generate_job(sampled, runtime, check=False)
    (batch,) = result.batches
    assert batch.n == len(few) and len(batch.latency_s) == len(batch.ttft_s) == len(batch.tpot_s) == len(records)
    assert "n" not in result.engine["sampling_params"] and result.provenance["samples"] == 3
    assert batch.input_tokens == unsampled.batches[0].input_tokens  # a prompt's tokens once, as on the own engine
    assert [(r.prompt_id, r.sample) for r in records] == [(p["id"], i) for p in few for i in range(3)]
    for r in records:
        assert r.seed == alone[r.prompt_id].seed + r.sample
        if r.sample == 0:
            assert r.token_ids == alone[r.prompt_id].token_ids
    assert all(len({tuple(r.token_ids) for r in records if r.prompt_id == p["id"]}) > 1 for p in few)
    (part,) = jobs_of([{"name": "top_p", "params": {"p": 0.9}, "samples": 3}], prompts=[few[2]])
    _, again = generate_job(part, runtime, check=False)
    assert [r.token_ids for r in again] == [r.token_ids for r in records if r.prompt_id == few[2]["id"]]


def mean_logprobs(hf, prompt_ids: list[int], token_ids: list[int]) -> float:
    """The transformers model's mean log-probability of `token_ids` after `prompt_ids`, the definition best_of
    ranks by."""
    model, _ = hf
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt_ids) - 1 : -1].double(), dim=-1)
    return float(logp[torch.arange(len(token_ids)), torch.tensor(token_ids)].mean())


def test_best_of_keeps_the_sample_the_model_finds_most_likely(runtime, hf):
    """issue 38: best_of: model on vLLM ranks a prompt's samples by their mean token log-probability under the
    model (vLLM's raw log-probabilities, checked against transformers' on the same tokens) and keeps the best,
    as the own engine does; best_of: scorer is refused in one line before vLLM starts."""
    few, variant = HELD_OUT[:4], {"name": "top_p", "params": {"p": 0.9, "temperature": 1.5}, "samples": 4}
    (sampled,) = jobs_of([variant], prompts=few)
    (best,) = jobs_of([{**variant, "best_of": "model"}], prompts=few)
    _, every = generate_job(sampled, runtime, check=False)
    result, kept = generate_job(best, runtime, check=False)
    assert [r.prompt_id for r in kept] == [p["id"] for p in few] and result.n_generations == len(few)
    assert any("best_of" in note for note in result.notes)
    prompt_ids = {p["id"]: hf[1](p["prompt"])["input_ids"] for p in few}
    for record in kept:
        samples = [r for r in every if r.prompt_id == record.prompt_id]
        expected = [mean_logprobs(hf, prompt_ids[r.prompt_id], r.token_ids) for r in samples]
        assert record.best_of == pytest.approx(expected, abs=1e-4)
        assert record.sample == max(range(len(expected)), key=lambda i: (expected[i], -i))
        assert record.token_ids == samples[record.sample].token_ids and record.seed == samples[record.sample].seed
    assert len({r.sample for r in kept}) > 1 or any(r.sample for r in kept)  # not always sample 0
    (by_scorer,) = jobs_of([{**variant, "best_of": "scorer"}], prompts=few, scorer=str(TINY_MODEL))
    with pytest.raises(PermanentJobError, match=r"best_of: scorer on engine vllm") as err:
        generate_job(by_scorer, runtime)
    assert "\n" not in str(err.value)


def test_stop_strings_cut_the_text_before_them(runtime):
    (job,) = jobs_of([{"name": "greedy"}], stop=[","])
    _, records = texts(job, runtime)
    stopped = [r for r in records.values() if r.stop_reason == "stop_string"]
    assert stopped, "no greedy continuation of the held-out prompts has a comma in 32 tokens"
    assert all("," not in r.text for r in records.values())


def check_first_token(runtime, hf, strategy, params):
    """2,000 first tokens from vLLM (one seed each) against the exact distribution from the logits."""
    model, tok = hf
    prompt = HELD_OUT[0]["prompt"]
    (job,) = jobs_of([{"name": "greedy"}])
    settings = sampling_settings(StrategySpec(name=strategy, params=params), job.generation)
    settings.update(max_tokens=1, min_tokens=0, stop=[])
    llm = llm_for(runtime, job, strategy)
    outs = llm.generate([prompt] * 2000, [sampling_params(settings, seed) for seed in range(2000)], use_tqdm=False)
    samples = [o.outputs[0].token_ids[0] for o in outs]
    exact = filtered_probs(next_token_logits(model, tok, prompt), strategy, params)
    result = g_test(samples, exact)
    assert result.outside_support == 0
    assert result.p_value > 1e-3, result
    wrong = filtered_probs(next_token_logits(model, tok, prompt), "sample", {"temperature": 2.0})
    assert g_test(samples, wrong).p_value < 1e-3  # the test can tell a wrong distribution apart
    if strategy in KINDS:  # ... and the filter from no filter at all
        unfiltered = filtered_probs(next_token_logits(model, tok, prompt), "sample", params)
        assert int((exact > 0).sum()) < int((unfiltered > 0).sum()) and g_test(samples, unfiltered).p_value < 1e-3


def check_second_token(runtime, hf, strategy, params):
    """2,000 pairs of first tokens from vLLM against P(t1) x P(t2 | t1) from the model's logits."""
    model, tok = hf
    prompt = HELD_OUT[1]["prompt"]
    (job,) = jobs_of([{"name": "greedy"}])
    settings = sampling_settings(StrategySpec(name=strategy, params=params), job.generation)
    settings.update(max_tokens=2, min_tokens=2, stop=[], ignore_eos=True)
    llm = llm_for(runtime, job, strategy)
    outs = llm.generate([prompt] * 2000, [sampling_params(settings, seed) for seed in range(2000)], use_tqdm=False)
    pairs = [tuple(o.outputs[0].token_ids[:2]) for o in outs]
    joint = second_token_probs(model, tok, prompt, strategy, params)
    result = g_test_pairs(pairs, joint)
    assert result.outside_support == 0 and result.p_value > 1e-3, result
    hotter = second_token_probs(model, tok, prompt, strategy, {**params, "temperature": 1.5})
    assert g_test_pairs(pairs, hotter).p_value < 1e-3  # a wrong second step is told apart


@pytest.mark.parametrize(
    ("strategy", "params"),
    [
        ("sample", {"temperature": 1.0}),
        ("top_k", {"k": 5, "temperature": 0.8}),
        ("top_p", {"p": 0.8, "temperature": 1.0}),
        ("min_p", {"p": 0.1, "temperature": 1.0}),
    ],
)
def test_first_token_distribution_matches_the_definition(runtime, hf, strategy, params):
    check_first_token(runtime, hf, strategy, params)


def test_second_token_distribution_matches_the_definition(runtime, hf):
    check_second_token(runtime, hf, "top_p", {"p": 0.8, "temperature": 1.0})


def test_beam_search_is_token_identical_to_transformers(runtime, hf):
    """vLLM's LLM.beam_search against generate(num_beams=4): the best beam of each prompt, token by token."""
    model, tok = hf
    (job,) = jobs_of([{"name": "beam", "params": {"num_beams": 4}}])
    result, records = texts(job, runtime)
    for p in HELD_OUT:
        enc = tok(p["prompt"], return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=False, num_beams=4, max_new_tokens=32, pad_token_id=0)
        assert records[p["id"]].token_ids == out[0, enc["input_ids"].shape[1] :].tolist(), p["id"]
    assert result.engine["sampling_params"]["beam_width"] == 4


def test_refused_and_bad_input_are_one_permanent_reason(runtime, tmp_path):
    store = open_store(f"file://{tmp_path}")
    (too_long,) = jobs_of([{"name": "greedy"}], engines=[{**ENGINE, "max_model_len": 1024}])
    with pytest.raises(PermanentJobError, match="max_model_len 1024 is beyond"):
        run_job(too_long, store=store, runtime=runtime)
    (contrastive,) = jobs_of([{"name": "contrastive"}])
    with pytest.raises(PermanentJobError, match="strategy contrastive on engine vllm"):
        generate_job(contrastive, runtime)


def test_a_mixed_sweep_runs_both_engines_locally(runtime, tmp_path):
    import pandas as pd

    from controller.launch.local import run_sweep
    from controller.report.compute.aggregate import summarize
    from controller.report.load.sweep import load_sweep

    data = {
        "name": "mixed",
        "models": [{"path": str(TINY_MODEL)}],
        "prompts": {"inline": [p["prompt"] for p in HELD_OUT[:4]]},
        "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
        "generation": {"max_new_tokens": 16, "warmup": False},
        "engines": [{"name": "decodebench"}, ENGINE],
    }
    store = open_store(f"file://{tmp_path}")
    outcome = run_sweep(parse_spec(data), store, progress=False, runtime=runtime)  # its LLM: the tests' one
    assert not outcome.failed and len(outcome.ran) == 4
    summary = summarize(load_sweep(store, "default", outcome.sweep_id), n_boot=0)
    rows = {r["cell"]: r for _, r in summary.iterrows()}
    assert (
        rows["austen-tiny::greedy::vllm"]["engine"] == "vllm" and rows["austen-tiny::greedy"]["engine"] == "decodebench"
    )
    assert rows["austen-tiny::greedy::vllm"]["engine_agreement"] == 1.0  # token-identical to the own engine
    top_p = next(c for c in rows if c.startswith("austen-tiny::top_p") and c.endswith("::vllm"))
    assert rows[top_p]["tokens_per_s"] > 0 and rows[top_p]["ttft_ms_p50"] > 0
    assert pd.isna(rows[top_p]["engine_agreement"])  # sampled: compared by distribution, not text
    assert rows[top_p]["engine_gtest_p"] > 1e-3 and pd.isna(rows["austen-tiny::greedy::vllm"]["engine_gtest_p"])
    results = load_sweep(store, "default", outcome.sweep_id).results
    (check,) = [r.engine["distribution_check"] for r in results if r.job.cell == top_p]
    assert (
        check["draws"] == 1000 and check["outside_support"] == 0 and check["p_value"] == rows[top_p]["engine_gtest_p"]
    )


# From here on the LLM with decodebench's logits processor (typical, epsilon, eta): started once, after
# every test of plain vLLM above.
@pytest.mark.parametrize(
    ("strategy", "params"),
    [
        ("typical", {"mass": 0.5, "temperature": 1.0}),
        ("epsilon", {"epsilon": 0.02, "temperature": 0.9}),
        ("eta", {"eta": 0.05, "temperature": 1.0}),
    ],
)
def test_first_token_distribution_with_the_logits_processor_matches_the_definition(runtime, hf, strategy, params):
    check_first_token(runtime, hf, strategy, params)


def test_second_token_distribution_with_the_logits_processor_matches_the_definition(runtime, hf):
    check_second_token(runtime, hf, "typical", {"mass": 0.5, "temperature": 1.0})


def test_a_model_vllm_cannot_load_is_one_permanent_reason(tmp_path):
    """An architecture vLLM lacks: one line naming the model and vLLM's reason, nothing written."""
    import shutil

    model = tmp_path / "odd"
    shutil.copytree(TINY_MODEL, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    data = {
        "name": "odd",
        "models": [{"path": str(model)}],
        "prompts": {"inline": ["Anne"]},
        "strategies": [{"name": "greedy"}],
        "engines": [ENGINE],
    }
    (job,) = plan(parse_spec(data))
    store = open_store(f"file://{tmp_path / 'runs'}")
    with pytest.raises(PermanentJobError) as err:
        run_job(job, store=store, runtime=Runtime("cpu"))
    assert str(err.value).startswith("engine vllm cannot load model odd: ") and "\n" not in str(err.value)
    assert not store.job_complete(job.tenant, job.sweep_id, job.job_id)


def test_a_model_vllm_loads_but_cannot_run_is_one_permanent_reason_and_the_next_job_runs(runtime, tmp_path):
    """A head size vLLM's CPU attention lacks (24) passes the load and fails in the first forward: one line naming
    the model and vLLM's reason, and the LLM let go, so the next job runs on a fresh one instead of waiting on the
    failed requests (it hung before)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = tmp_path / "head24"
    config = GPT2Config(vocab_size=len(AutoTokenizer.from_pretrained(TINY_MODEL)), n_embd=96, n_head=4, n_layer=1)
    GPT2LMHeadModel(config).save_pretrained(model)
    AutoTokenizer.from_pretrained(TINY_MODEL).save_pretrained(model)
    data = {
        "name": "head24",
        "models": [{"path": str(model)}],
        "prompts": {"inline": ["Anne"]},
        "strategies": [{"name": "greedy"}],
        "generation": {"max_new_tokens": 4, "warmup": False},
        "engines": [ENGINE],
    }
    (job,) = plan(parse_spec(data))
    with pytest.raises(PermanentJobError) as err:
        generate_job(job, runtime, check=False)
    assert str(err.value).startswith("engine vllm cannot run model head24: ") and "\n" not in str(err.value)
    assert "head_dim=24" in str(err.value) and runtime.vllm.loaded is None
    (greedy,) = jobs_of([{"name": "greedy"}], prompts=HELD_OUT[:2], max_new_tokens=8)
    _, records = generate_job(greedy, runtime, check=False)
    assert len(records) == 2 and all(r.token_ids for r in records)
