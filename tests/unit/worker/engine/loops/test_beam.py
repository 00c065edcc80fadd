"""Beam search as the step of the engine's decode loop (token for token generate()'s, prompts that
are done dropping out of the forward pass) and diverse (group) beam search: transformers' beam
search as its one-group case, the Hamming diversity term, a cache-free implementation from the
paper, and the parameter check."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import GenerationConfig

from tests.support.beam import CountingModel, generate, search
from tests.support.engine import job as engine_job
from tests.support.services import AUSTEN_PROMPTS
from worker.core.contract import ModelSpec
from worker.engine.job import generate_job
from worker.engine.loops import beam as beam_loop
from worker.strategies import get_strategy

PROMPTS = AUSTEN_PROMPTS[:5] + ["Anne"]


@pytest.fixture(scope="module")
def lm(tiny_model, runtime):
    return runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)


def comma_id(tok) -> int:
    """A frequent token used as EOS in some tests, so that hypotheses finish early."""
    tid = tok.convert_tokens_to_ids(",")
    return tid if isinstance(tid, int) and tid != tok.unk_token_id else tok.eos_token_id


def cut(seq: list[int], eos: int) -> list[int]:
    return seq[: seq.index(eos) + 1] if eos in seq else seq


def run(lm, prompts, max_new, eos=None, **params):
    """Our loop on a left-padded batch: (encoding, hypotheses, scores, lengths, best rows)."""
    tok = lm.tokenizer
    enc = tok(prompts, return_tensors="pt", padding=True)
    cfg = GenerationConfig(
        max_new_tokens=max_new, eos_token_id=eos if eos is not None else tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    p = {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.5, "length_penalty": 1.0, **params}
    args = (lm.model, enc, cfg, p)
    return enc, *search(*args), generate(*args)


def hf_beam(lm, enc, num_beams, max_new, eos, length_penalty=1.0, early_stopping=False):
    with torch.inference_mode():
        return lm.model.generate(
            **enc,
            num_beams=num_beams,
            do_sample=False,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            max_new_tokens=max_new,
            eos_token_id=eos,
            pad_token_id=lm.tokenizer.pad_token_id,
        )


def new_tokens(out, enc, eos) -> list[list[int]]:
    return [cut(row, eos) for row in out[:, enc["input_ids"].shape[1] :].tolist()]


def job(model, strategy, params, batch_size, max_new, prompts=PROMPTS):
    return engine_job(model, strategy, params, batch_size=batch_size, max_new=max_new, prompts=prompts)


def test_one_group_without_penalty_is_transformers_beam_search_through_the_engine(tiny_model, runtime, lm):
    params = {"num_beams": 3, "num_beam_groups": 1, "diversity_penalty": 0.0, "length_penalty": 1.0}
    _, records = generate_job(job(tiny_model, "diverse_beam", params, 4, 12, prompts=PROMPTS[:4]), runtime)
    eos = lm.tokenizer.eos_token_id
    assert len(records) == 4
    for prompt, rec in zip(PROMPTS, records):
        enc = lm.tokenizer(prompt, return_tensors="pt")
        assert rec.token_ids == new_tokens(hf_beam(lm, enc, 3, 12, eos), enc, eos)[0], prompt


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping", [(4, 2.0, False), (3, -0.5, False), (3, 1.0, True)])
def test_one_group_matches_beam_search_when_hypotheses_finish_early(lm, num_beams, length_penalty, early_stopping):
    # a frequent token as EOS exercises finished hypotheses, the length penalty and early stopping
    eos = comma_id(lm.tokenizer)
    enc, _, _, _, best = run(
        lm,
        PROMPTS[:4],
        10,
        eos=eos,
        num_beams=num_beams,
        num_beam_groups=1,
        diversity_penalty=0.0,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    expected = hf_beam(lm, enc, num_beams, 10, eos, length_penalty, early_stopping)
    assert new_tokens(best, enc, eos) == new_tokens(expected, enc, eos)


def test_groups_without_penalty_repeat_and_a_large_penalty_diversifies(lm):
    eos = lm.tokenizer.eos_token_id
    enc, hyps0, scores0, lens0, best0 = run(lm, PROMPTS[:3], 8, diversity_penalty=0.0)
    # without the penalty the two groups are the same search: beam search with 2 beams
    assert torch.equal(hyps0[:, :2], hyps0[:, 2:]) and torch.allclose(scores0[:, :2], scores0[:, 2:])
    assert new_tokens(best0, enc, eos) == new_tokens(hf_beam(lm, enc, 2, 8, eos), enc, eos)

    enc, hyps, scores, lens, best = run(lm, PROMPTS[:3], 8, diversity_penalty=1e4)
    assert torch.equal(hyps[:, :2], hyps0[:, :2])  # group 0 is never penalised
    start = enc["input_ids"].shape[1]
    vocab = lm.model.config.vocab_size
    for b in range(len(PROMPTS[:3])):
        first = [{int(t) for t in hyps[b, cols, start]} - {eos} for cols in (slice(0, 2), slice(2, 4))]
        assert first[0] and first[1] and not first[0] & first[1]  # group 1 avoided group 0's first tokens
        assert not torch.equal(hyps[b, 2:], hyps0[b, 2:])
        assert bool((scores[b] > -1e8).all()) and bool((lens[b] >= 1).all())
        assert bool((hyps[b, :, start:] < vocab).all()) and bool((hyps[b, :, start:] >= 0).all())


def naive_diverse_beam(model, prompt: list[int], num_beams, groups, penalty, length_penalty, steps, eos):
    """Diverse beam search for one prompt from the paper (Alg. 1), no cache, plain lists.

    Each group keeps K = num_beams / groups beams; at each step the groups run one step of beam
    search in turn, on log-probabilities minus `penalty` per beam of an earlier group that picked
    the same token at this step. Ending candidates among a group's top K become hypotheses scored
    sum / length ** length_penalty; a group stops once its K hypotheses beat its best running beam.
    """
    k = num_beams // groups
    running = [[(0.0, [])] for _ in range(groups)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(groups)]
    open_ = [True] * groups
    for t in range(steps):
        picked = torch.zeros(model.config.vocab_size)
        for g in range(groups):
            cands = []
            for score, toks in running[g]:
                with torch.inference_mode():
                    logits = model(torch.tensor([prompt + toks])).logits[0, -1].float()
                total = score + torch.log_softmax(logits, -1) - penalty * picked
                values, ids = total.topk(2 * k)
                cands += [(float(s), toks + [int(v)]) for s, v in zip(values, ids)]
            cands = sorted(cands, key=lambda c: -c[0])[: 2 * k]
            is_eos = [toks[-1] == eos for _, toks in cands]
            ends = [e or t == steps - 1 for e in is_eos]  # at the length limit every candidate ends
            if open_[g]:
                finished[g] += [(s / (t + 1) ** length_penalty, toks) for (s, toks), e in zip(cands[:k], ends) if e]
                finished[g] = sorted(finished[g], key=lambda h: -h[0])[:k]
            running[g] = [c for c, e in zip(cands, is_eos) if not e][:k]  # the group's picks at this step
            if open_[g]:
                for _, toks in running[g]:
                    picked[toks[-1]] += 1
        if t == steps - 1:
            break
        for g in range(groups):
            full = len(finished[g]) == k
            if full and running[g][0][0] / (t + 1) ** length_penalty <= min(s for s, _ in finished[g]):
                open_[g] = False
        if not any(open_):
            break
    return finished


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_matches_a_cache_free_implementation_from_the_paper(lm, prompt):
    eos = comma_id(lm.tokenizer)
    enc, hyps, scores, lens, best = run(
        lm, [prompt], 5, eos=eos, num_beams=4, num_beam_groups=2, diversity_penalty=0.8, length_penalty=1.0
    )
    expected = naive_diverse_beam(lm.model, enc["input_ids"][0].tolist(), 4, 2, 0.8, 1.0, 5, eos)
    start = enc["input_ids"].shape[1]
    ours = [[hyps[0, j, start : start + int(lens[0, j])].tolist() for j in cols] for cols in ((0, 1), (2, 3))]
    assert ours == [[toks for _, toks in group] for group in expected]
    best_expected = max((h for group in expected for h in group), key=lambda h: h[0])[1]
    assert best[0, start:].tolist()[: len(best_expected)] == best_expected


def test_num_beams_must_be_divisible_by_num_beam_groups(lm):
    message = r"num_beams \(4\) must be divisible by num_beam_groups \(3\)"
    with pytest.raises(ValueError, match=message):  # when a sweep is planned
        get_strategy("diverse_beam").validate({"num_beams": 4, "num_beam_groups": 3})
    with pytest.raises(ValueError, match=message):  # and in the loop itself
        run(lm, PROMPTS[:1], 2, num_beams=4, num_beam_groups=3)
    assert get_strategy("diverse_beam").validate({"num_beams": 6, "num_beam_groups": 3})["num_beam_groups"] == 3


def generate_path(monkeypatch):
    """The `beam` strategy through transformers' generate() (the engine's beam loop switched off)."""
    monkeypatch.setattr(beam_loop, "supports", lambda config: False)


def outputs(records):
    return [(r.token_ids, r.text, r.stop_reason, r.n_new_tokens) for r in records]


BEAM_CASES = [  # (beam params, stop strings, max new tokens, min new tokens)
    ({"num_beams": 3}, [","], 16, 0),
    ({"num_beams": 4, "length_penalty": 2.0, "early_stopping": True}, [], 12, 0),
    ({"num_beams": 3, "early_stopping": True}, [","], 16, 0),
    ({"num_beams": 3, "length_penalty": -0.5, "repetition_penalty": 1.3, "no_repeat_ngram_size": 2}, ["."], 14, 4),
]


@pytest.mark.parametrize("params,stop,max_new,min_new", BEAM_CASES)
def test_the_beam_strategy_runs_in_the_beam_loop_and_equals_generate(
    tiny_model, runtime, monkeypatch, params, stop, max_new, min_new
):
    """`beam` runs in the engine's beam loop, token for token what generate()'s beam search gives:
    stop strings end hypotheses inside the search, early stopping, length and repetition penalties,
    n-gram bans and a minimum length included."""
    spec = engine_job(tiny_model, "beam", params, batch_size=4, max_new=max_new, stop=stop, prompts=PROMPTS)
    spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"min_new_tokens": min_new})})
    ours_result, ours = generate_job(spec, runtime)
    assert "worker.engine.loops.beam" in ours_result.engine["decode_loop"]
    generate_path(monkeypatch)
    theirs_result, theirs = generate_job(spec, runtime)
    assert theirs_result.engine["decode_loop"] == "transformers generate()"
    assert outputs(ours) == outputs(theirs)
    if stop == [","]:
        assert {r.stop_reason for r in theirs} >= {"stop_string"}
        eos = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device).tokenizer.eos_token_id
        ended = [r for r in ours if r.stop_reason == "stop_string"]
        assert all(r.token_ids[-1] != eos and r.n_new_tokens == len(r.token_ids) for r in ended)  # no padding counted


def test_one_group_ends_hypotheses_at_stop_strings_as_transformers_beam_search_does(tiny_model, runtime, monkeypatch):
    """Stop strings end diverse beam search's hypotheses inside the search (not a cut of the finished
    text), as in generate(): one group without penalty is generate()'s beam search."""
    params = {"num_beams": 3, "num_beam_groups": 1, "diversity_penalty": 0.0, "length_penalty": 1.0}
    stop = [","]
    diverse = engine_job(tiny_model, "diverse_beam", params, batch_size=4, max_new=16, stop=stop, prompts=PROMPTS[:4])
    beam = engine_job(tiny_model, "beam", {"num_beams": 3}, batch_size=4, max_new=16, stop=stop, prompts=PROMPTS[:4])
    _, ours = generate_job(diverse, runtime)
    generate_path(monkeypatch)
    _, theirs = generate_job(beam, runtime)
    assert {r.stop_reason for r in theirs} >= {"stop_string"}
    assert outputs(ours) == outputs(theirs)


def test_the_beam_loop_takes_only_what_it_reproduces():
    base = {"num_beams": 4, "do_sample": False, "early_stopping": False}
    assert beam_loop.supports(GenerationConfig(**base))
    assert beam_loop.supports(GenerationConfig(**{**base, "early_stopping": True, "repetition_penalty": 1.2}))
    for other in (
        {"early_stopping": "never"},  # estimates the best length from max_length
        {"num_return_sequences": 2},
        {"do_sample": True},  # beam sampling
        {"num_beams": 1},
        {"cache_implementation": "static"},
        {"bad_words_ids": [[5]]},
        {"renormalize_logits": True},
    ):
        assert not beam_loop.supports(GenerationConfig(**{**base, **other})), other


@pytest.mark.parametrize("groups,penalty,length_penalty", [(2, 0.5, 1.0), (1, 0.0, 0.0)])
def test_prompts_whose_search_is_over_leave_the_forward_pass_and_each_prompt_is_as_if_alone(
    lm, groups, penalty, length_penalty
):
    """Compaction: the forward pass shrinks as prompts finish, and no prompt's hypotheses change."""
    tok, eos = lm.tokenizer, comma_id(lm.tokenizer)  # a frequent EOS: prompts finish at different steps
    cfg = GenerationConfig(max_new_tokens=32, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    params = {"num_beams": 4, "num_beam_groups": groups, "diversity_penalty": penalty, "length_penalty": length_penalty}
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    counting = CountingModel(lm.model)
    hyps, scores, lens = search(counting, enc, cfg, params)
    batch_rows = len(PROMPTS) * 4
    assert counting.rows[0] == len(PROMPTS) and counting.rows[1] == batch_rows
    assert all(a >= b for a, b in zip(counting.rows[1:], counting.rows[2:])), counting.rows
    assert 0 < counting.rows[-1] < batch_rows, counting.rows  # some prompts left the pass before the last step
    start = enc["input_ids"].shape[1]
    for b, prompt in enumerate(PROMPTS):
        one = tok([prompt], return_tensors="pt")
        h1, s1, l1 = search(lm.model, one, cfg, params)
        assert torch.equal(lens[b], l1[0]), prompt
        for j in range(4):
            n = int(l1[0, j])
            assert hyps[b, j, start : start + n].tolist() == h1[0, j, one["input_ids"].shape[1] :][:n].tolist(), prompt
        assert torch.allclose(scores[b], s1[0], atol=1e-4), prompt


def test_beam_with_the_static_cache_opt_in_keeps_generate(tiny_model, runtime):
    """static_cache: true asks for transformers' static cache (compiled on CUDA): generate() runs it."""
    spec = engine_job(tiny_model, "beam", {"num_beams": 2}, batch_size=2, max_new=4, prompts=PROMPTS[:2])
    spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"static_cache": True})})
    result, records = generate_job(spec, runtime)
    assert result.engine["decode_loop"] == "transformers generate()" and len(records) == 2


def test_a_sliding_window_model_runs_beam_search_in_the_loop_as_generate_does(
    tiny_model, runtime, monkeypatch, tmp_path
):
    """Sliding-window layers repeat, reorder and select like full ones: the loop takes them, token for token."""
    from transformers import AutoTokenizer, MistralForCausalLM

    from tests.support.engine import sliding_window_config

    torch.manual_seed(0)
    MistralForCausalLM(sliding_window_config(vocab_size=4096)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
    spec = engine_job(str(tmp_path), "beam", {"num_beams": 3}, batch_size=4, max_new=10, prompts=PROMPTS)
    ours_result, ours = generate_job(spec, runtime)
    assert "worker.engine.loops.beam" in ours_result.engine["decode_loop"]
    generate_path(monkeypatch)
    assert outputs(ours) == outputs(generate_job(spec, runtime)[1])


def test_a_model_without_transformers_plain_cache_keeps_generate():
    from types import SimpleNamespace

    from transformers import GPT2Config

    from worker.engine.kvcache import reorderable

    class OwnCache:  # as a model class transformers gives no default dynamic cache (rwkv, xlstm, ...)
        config = GPT2Config(n_layer=2)

        @classmethod
        def _supports_default_dynamic_cache(cls):
            return False

    assert not reorderable(OwnCache())
    assert not reorderable(SimpleNamespace(config=None))  # no layer types to check
    assert not reorderable(SimpleNamespace(config=object()))  # a config transformers' cache cannot read
    assert reorderable(SimpleNamespace(config=GPT2Config(n_layer=2)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(PROMPTS) - 1), min_size=2, max_size=5),
    groups=st.sampled_from([1, 2]),
    beams_each=st.integers(1, 3),
    length_penalty=st.sampled_from([-0.5, 0.0, 1.0, 2.0]),
    early_stopping=st.booleans(),
    max_new=st.integers(2, 20),
)
def test_any_batch_gives_every_prompt_its_search_alone(
    lm, picks, groups, beams_each, length_penalty, early_stopping, max_new
):
    """However prompts finish and leave the forward pass, each one's hypotheses are those of its search alone."""
    tok, eos = lm.tokenizer, comma_id(lm.tokenizer)
    prompts = [PROMPTS[i] for i in picks]
    cfg = GenerationConfig(max_new_tokens=max_new, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    params = {
        "num_beams": groups * max(beams_each, 2 // groups),
        "num_beam_groups": groups,
        "diversity_penalty": 0.5 if groups > 1 else 0.0,
        "length_penalty": length_penalty,
        "early_stopping": early_stopping,
    }
    enc = tok(prompts, return_tensors="pt", padding=True)
    hyps, scores, lens = search(lm.model, enc, cfg, params)
    start, n = enc["input_ids"].shape[1], params["num_beams"]
    for b, prompt in enumerate(prompts):
        one = tok([prompt], return_tensors="pt")
        h1, s1, l1 = search(lm.model, one, cfg, params)
        assert torch.equal(lens[b], l1[0]), prompt
        for j in range(n):
            m = int(l1[0, j])
            assert hyps[b, j, start : start + m].tolist() == h1[0, j, one["input_ids"].shape[1] :][:m].tolist()
        assert torch.allclose(scores[b], s1[0], atol=1e-4), prompt


def test_looking_for_finished_prompts_every_8_steps_as_on_cuda_changes_no_hypothesis(lm):
    """On CUDA the beam loop looks for prompts that are over every 8 steps (a host synchronisation): they
    leave the forward pass only then, and every hypothesis is what looking every step gives."""
    tok, eos = lm.tokenizer, comma_id(lm.tokenizer)
    cfg = GenerationConfig(max_new_tokens=32, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    params = {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.5, "length_penalty": 0.0}
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    args = (enc, cfg, params)
    every_step = search(lm.model, *args)
    counting = CountingModel(lm.model)
    every_8 = search(counting, *args, check_every=8)
    passes = counting.rows[1:]  # the forward pass after step j (0-based) feeds step j + 1
    changes = [j for j in range(1, len(passes)) if passes[j] != passes[j - 1]]
    assert changes and all((j + 1) % 8 == 0 for j in changes), passes  # right after the checks at steps 8, 16...
    (hyps, scores, lens), (hyps1, scores1, lens1) = every_8, every_step
    assert torch.equal(hyps, hyps1) and torch.equal(lens, lens1)
    assert torch.allclose(scores, scores1, atol=1e-4)  # the batch's rows differ between the two: float rounding
