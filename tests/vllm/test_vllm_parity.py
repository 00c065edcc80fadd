"""Where the vLLM engine and the own engine must agree beyond the tokens (issue 26; docs/engines.md): scores, the
chat record, the report's distribution check, stop reasons and what vLLM's beam search refuses. Runs in .venv-vllm
with tests/vllm/test_vllm_engine.py (tests/vllm/test_vllm_env.py runs both there). The tests share the runtime's LLM
and run in the order of the LLM they need: austen-tiny's, the chat model's, then adder-tiny's, each started once."""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")

from transformers import AutoTokenizer  # noqa: E402

from controller.sweep.load import parse_spec  # noqa: E402
from controller.sweep.plan import plan  # noqa: E402
from tests.support.services import TINY_MODEL  # noqa: E402
from tests.support.vllmjobs import ENGINE, HELD_OUT, jobs_of  # noqa: E402
from worker.core.errors import PermanentJobError  # noqa: E402
from worker.engine.job import Runtime  # noqa: E402
from worker.engine.vllm.run import generate_job  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runtime():
    return Runtime("cpu")


def test_generations_are_scored_under_the_generating_model_as_on_the_own_engine(runtime):
    """Perplexity (and coherence) of a vLLM cell: its generations' NLLs under the generating model, the own engine's
    default scorer, equal to the own engine's scores of the same tokens. vLLM's records had none: the report's
    perplexity of every vLLM cell was blank, with no word of why."""
    from worker.engine.job import generate_job as own_generate_job

    (greedy_job,) = jobs_of([{"name": "greedy"}], prompts=HELD_OUT[:4])
    assert "score" in greedy_job.compute and greedy_job.scorer is None
    _, greedy = generate_job(greedy_job, runtime, check=False)
    _, own_greedy = own_generate_job(greedy_job.model_copy(update={"engine": None}), runtime)
    assert [r.token_ids for r in greedy] == [r.token_ids for r in own_greedy]
    assert [r.nll_count for r in greedy] == [r.nll_count for r in own_greedy]
    assert [r.nll_sum for r in greedy] == pytest.approx([r.nll_sum for r in own_greedy], rel=1e-4)


def test_a_chat_job_feeds_vllm_the_template_ids_the_own_engine_feeds(runtime):
    """issue 38: vLLM gets apply_chat_template's ids as token-id prompts (not its own rendering of the text), stops
    at the end of the turn, and writes the own engine's greedy tokens (and scores). The first test of the chat LLM."""
    from worker.core.chat import conversation
    from worker.engine.job import generate_job as own_generate_job

    model = TINY_MODEL.parent / "austen-tiny-chat"
    data = {
        "name": "vllm-chat",
        "models": [{"path": str(model), "system": "You continue passages in the manner of Jane Austen."}],
        "prompts": {"inline": [{"id": "a", "messages": [{"role": "user", "content": "Anne had been"}]}, "She was"]},
        "strategies": [{"name": "greedy"}],
        "generation": {"max_new_tokens": 24, "warmup": False},
        "engines": [ENGINE],
    }
    (job,) = plan(parse_spec(data))
    result, records = generate_job(job, runtime, check=False)
    tok = AutoTokenizer.from_pretrained(model)
    rendered = {
        p.id: tok.apply_chat_template(conversation(p, job.model), add_generation_prompt=True, return_dict=False)
        for p in job.prompts
    }
    assert result.engine["chat"]["prompt_tokens"] == {k: len(v) for k, v in rendered.items()}
    assert result.batches[0].input_tokens == sum(len(v) for v in rendered.values())
    _, own = own_generate_job(job.model_copy(update={"engine": None}), runtime)
    assert [r.token_ids for r in records] == [r.token_ids for r in own]
    assert [r.nll_sum for r in records] == pytest.approx([r.nll_sum for r in own], rel=1e-4)  # the end of turn too
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert all(r.token_ids[-1] == im_end for r in records if r.stop_reason == "eos") and "<|im" not in records[0].text


def test_a_chat_jobs_distribution_check_draws_after_the_prompt_the_job_fed(runtime):
    """The report's distribution check of a chat cell drew its first tokens after the raw prompt text, not the
    rendered template the job fed vLLM: its G-test was the raw cell's, to the digit. Uses the chat model's LLM."""
    model = TINY_MODEL.parent / "austen-tiny-chat"
    checks = {}
    for chats in (True, False):
        data = {
            "name": "vllm-chat-check",
            "models": [{"path": str(model), "chat": chats}],
            "prompts": {"inline": [{"id": "a", "messages": [{"role": "user", "content": "Anne had been"}]}]},
            "strategies": [{"name": "top_p", "params": {"p": 0.9}}],
            "generation": {"max_new_tokens": 4, "warmup": False},
            "engines": [ENGINE],
        }
        if not chats:
            data["prompts"]["inline"] = [{"id": "a", "prompt": "Anne had been"}]
        (job,) = plan(parse_spec(data))
        result, _ = generate_job(job, runtime)
        checks[chats] = (result.engine["distribution_check"], (result.engine.get("chat") or {}).get("prompt_tokens"))
    (chat_check, fed), (raw_check, _) = checks[True], checks[False]
    assert chat_check["g"] != raw_check["g"]
    assert chat_check["prompt_tokens"] == fed["a"] > raw_check["prompt_tokens"]


def test_beam_on_a_model_whose_generation_config_ends_at_other_ids_is_refused(runtime):
    """A raw-prompt job on the chat model: its generation config ends at <|im_end|> (4097) as well as at EOS, where
    the own engine's beams end; vLLM's beam search ends only at the tokenizer's EOS, and ran on past <|im_end|> into
    turns the model made up (every beam 'length', texts of 'system\\nYou continue ...'). Uses the chat model's LLM."""
    model = TINY_MODEL.parent / "austen-tiny-chat"
    data = {
        "name": "vllm-raw-beam",
        "models": [{"path": str(model), "chat": False}],
        "prompts": {"inline": ["She was"]},
        "strategies": [{"name": "beam", "params": {"num_beams": 2}}],
        "generation": {"max_new_tokens": 24, "warmup": False},
        "engines": [ENGINE],
    }
    (job,) = plan(parse_spec(data))
    with pytest.raises(PermanentJobError, match=r"^refused: beam on engine vllm for model .*EOS ids \[4097\]$"):
        generate_job(job, runtime, check=False)


def test_a_beam_ending_at_eos_on_its_last_allowed_token_stops_at_eos_as_on_the_own_engine(runtime):
    """vLLM's beam search said 'length' for a beam that ended at EOS on its last allowed token, where the own engine
    (and vLLM's own generate()) says 'eos'. adder-tiny's worked answer ends at EOS; max_new_tokens is its length.
    Last: it loads adder-tiny's LLM."""
    from worker.engine.job import generate_job as own_generate_job

    data = {
        "name": "vllm-beam-eos",
        "models": [{"path": str(TINY_MODEL.parent / "adder-tiny")}],
        "prompts": {"inline": [{"id": "add", "prompt": "141+365=?\n"}]},
        "strategies": [{"name": "beam", "params": {"num_beams": 3}}],
        "generation": {"max_new_tokens": 40, "warmup": False},
        "engines": [ENGINE],
    }
    (job,) = plan(parse_spec(data))
    (free,) = generate_job(job, runtime, check=False)[1]
    assert free.stop_reason == "eos" and free.n_new_tokens < 40
    exact = job.model_copy(
        update={"generation": job.generation.model_copy(update={"max_new_tokens": free.n_new_tokens})}
    )
    (record,) = generate_job(exact, runtime, check=False)[1]
    (own,) = own_generate_job(exact.model_copy(update={"engine": None}), runtime)[1]
    assert (record.token_ids, record.stop_reason) == (own.token_ids, own.stop_reason) == (free.token_ids, "eos")
