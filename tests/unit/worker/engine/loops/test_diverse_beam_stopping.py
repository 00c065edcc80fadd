"""diverse_beam's `stopping`: groups stop as transformers 4.x's group beam search stopped them (once their
hypotheses cannot be beaten by the best of the group's candidates at the step, ending ones included), or,
by default and as before, by transformers 5's rule (the best running beam). Checked against a hand-written
cache-free group beam search kept here, with 4.x's `BeamHypotheses` bookkeeping; the default changes no
output and no id."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from tests.support.beam import search
from tests.support.engine import job
from tests.support.services import AUSTEN_PROMPTS
from worker.core.contract import ModelSpec
from worker.engine.job import generate_job
from worker.strategies import get_strategy

PROMPTS = AUSTEN_PROMPTS[:5]


@pytest.fixture(scope="module")
def lm(tiny_model, runtime):
    return runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)


class Hypotheses:
    """transformers 4.x's `BeamHypotheses` (early_stopping=False): the k best finished hypotheses of a group."""

    def __init__(self, k: int, length_penalty: float) -> None:
        self.k, self.length_penalty, self.beams, self.worst = k, length_penalty, [], 1e9

    def add(self, tokens: list[int], sum_logprobs: float, length: int) -> None:
        score = sum_logprobs / length**self.length_penalty
        if len(self.beams) < self.k or score > self.worst:
            self.beams.append((score, tokens))
            if len(self.beams) > self.k:
                self.beams.remove(min(self.beams, key=lambda b: b[0]))
            self.worst = min(s for s, _ in self.beams)

    def is_done(self, best_sum_logprobs: float, length: int) -> bool:
        return len(self.beams) == self.k and self.worst >= best_sum_logprobs / length**self.length_penalty


def group_beam_search(model, prompt, num_beams, groups, penalty, length_penalty, steps, eos, stopping):
    """One prompt's group beam search, no cache: each group's finished hypotheses, best first.

    Groups take turns at each step on log-probabilities minus `penalty` per pick of an earlier (still
    searching) group at this step; of a group's 2K best candidates the top K that end become hypotheses
    (at the length limit all do) and the K best that do not end run on. A group is done, and stops adding
    hypotheses and steering later groups, once `Hypotheses.is_done` holds for its best running beam
    ("best_running") or, as transformers 4.x's group beam search checked it, for the best of all its
    candidates at the step ("best_candidate")."""
    k = num_beams // groups
    running = [[(0.0, [])] for _ in range(groups)]
    pools = [Hypotheses(k, length_penalty) for _ in range(groups)]
    done = [False] * groups
    for t in range(steps):
        picked = torch.zeros(model.config.vocab_size)
        best = [0.0] * groups
        for g in range(groups):
            cands = []
            for score, toks in running[g]:
                with torch.inference_mode():
                    logits = model(torch.tensor([prompt + toks])).logits[0, -1].float()
                values, ids = (score + torch.log_softmax(logits, -1) - penalty * picked).topk(2 * k)
                cands += [(float(v), toks + [int(i)]) for v, i in zip(values, ids)]
            cands.sort(key=lambda c: -c[0])
            cands = cands[: 2 * k]
            running[g] = [c for c in cands if c[1][-1] != eos][:k]
            best[g] = running[g][0][0] if stopping == "best_running" else cands[0][0]
            if done[g]:
                continue
            for score, toks in cands[:k]:
                if toks[-1] == eos or t == steps - 1:
                    pools[g].add(toks, score, t + 1)
            for _, toks in running[g]:
                picked[toks[-1]] += 1
        for g in range(groups):
            done[g] = done[g] or pools[g].is_done(best[g], t + 1)
        if all(done):
            break
    return [sorted(pool.beams, key=lambda b: -b[0]) for pool in pools]


def comma_id(tok) -> int:
    """A frequent token as EOS, so that hypotheses finish early and groups stop."""
    return tok.convert_tokens_to_ids(",")


def ours(lm, prompt, steps, eos, stopping, **params):
    """The engine's step on one prompt: each group's hypotheses (new tokens), best first, with scores."""
    tok = lm.tokenizer
    enc = tok([prompt], return_tensors="pt")
    cfg = GenerationConfig(max_new_tokens=steps, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    p = {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.8, "length_penalty": 1.0, **params}
    hyps, scores, lens = search(lm.model, enc, cfg, {**p, "stopping": stopping})
    start, k = enc["input_ids"].shape[1], p["num_beams"] // p["num_beam_groups"]
    return [
        [(float(scores[0, j]), hyps[0, j, start : start + int(lens[0, j])].tolist()) for j in range(g * k, g * k + k)]
        for g in range(p["num_beam_groups"])
    ]


def same(a, b) -> bool:
    """The same hypotheses, in the same order, with the same scores (to float rounding)."""
    return all(
        [t for _, t in ga] == [t for _, t in gb] and all(abs(x - y) < 1e-4 for (x, _), (y, _) in zip(ga, gb))
        for ga, gb in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS[3]])
def test_each_rule_is_the_hand_written_group_beam_search_and_the_4x_rule_searches_on(lm, prompt):
    """Each group's hypotheses (tokens and scores) under either rule are the hand-written search's; on these
    prompts a group whose best candidate ends (at the comma) still beats its worst hypothesis, so the 4.x rule
    searches on where transformers 5's stops, and the hypotheses differ."""
    eos = comma_id(lm.tokenizer)
    ids = lm.tokenizer(prompt)["input_ids"]
    expected = {}
    for rule in ("best_running", "best_candidate"):
        expected[rule] = group_beam_search(lm.model, ids, 4, 2, 0.8, 1.0, 10, eos, rule)
        assert same(ours(lm, prompt, 10, eos, rule), expected[rule]), rule
    assert not same(expected["best_running"], expected["best_candidate"])


def test_stopping_is_validated_in_one_line_and_unset_by_default():
    strategy = get_strategy("diverse_beam")
    with pytest.raises(ValueError, match=r"^stopping must be one of best_running, best_candidate, got '4.x'$"):
        strategy.validate({"stopping": "4.x"})
    assert "stopping" not in strategy.validate({})  # a default-valued parameter is not in the variant's params
    assert strategy.validate({"stopping": "best_candidate"})["stopping"] == "best_candidate"


def test_the_default_keeps_every_id_of_existing_sweeps():
    """The sweep and job ids (and cell names) a diverse_beam sweep had before the parameter existed."""
    from controller.sweep.load import parse_spec
    from controller.sweep.plan import plan

    strategies = [{"name": "diverse_beam"}, {"name": "diverse_beam", "params": {"num_beams": 6, "num_beam_groups": 3}}]
    spec = parse_spec(
        {"name": "d", "models": [{"path": "org/model-a"}], "prompts": {"inline": ["a", "b"]}, "strategies": strategies}
    )
    jobs = plan(spec)
    assert jobs[0].sweep_id == "fad750f8dbb1341c"
    assert [j.job_id for j in jobs] == ["343a025c59b21231", "17a661317cf48220"]
    assert (
        jobs[0].cell == "model-a::diverse_beam(diversity_penalty=0.5,length_penalty=1.0,num_beam_groups=2,num_beams=4)"
    )


def test_a_job_runs_either_rule_in_the_own_loop_and_the_default_is_best_running(tiny_model, runtime):
    params = {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.8}
    runs = {}
    for stopping in (None, "best_running", "best_candidate"):
        chosen = params if stopping is None else {**params, "stopping": stopping}
        spec = job(tiny_model, "diverse_beam", chosen, batch_size=2, max_new=12, stop=[","], prompts=PROMPTS)
        result, records = generate_job(spec, runtime)
        assert result.engine["decode_loop"].startswith("worker.engine.decode (beam search's step")
        assert result.generation_config["decodebench_loop"].get("stopping") == stopping
        runs[stopping] = [(r.token_ids, r.stop_reason) for r in records]
    assert runs[None] == runs["best_running"]
    assert len(runs["best_candidate"]) == len(PROMPTS)
