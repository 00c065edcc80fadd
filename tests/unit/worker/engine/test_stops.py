"""Stop strings by table lookup (worker.engine.stops) against transformers' StopStringCriteria, over every
token of the vocabulary as a row's last token, after random prefixes and after texts that end in a stop string."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer
from transformers.generation.stopping_criteria import StopStringCriteria

from tests.support.services import AUSTEN_PROMPTS
from worker.engine.stops import StopStrings

STOP_SETS = [["."], [","], ["\n"], [".", ","], ["!", "?", ";"], [" the"], ["\n\n"], ["ing."], [".", " and"]]


@pytest.fixture(scope="module")
def tok(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def rows(tok, stop: list[str]) -> torch.Tensor:
    """Every vocabulary id after a random prefix, and every cut of texts that end in (or pass) a stop string."""
    vocab = len(tok)
    gen = torch.Generator().manual_seed(0)
    every = torch.cat([torch.randint(0, vocab, (vocab, 7), generator=gen), torch.arange(vocab)[:, None]], dim=1)
    texts = [p + s + tail for p in AUSTEN_PROMPTS[:6] for s in stop for tail in ("", " said", "er")]
    cuts = []
    for text in texts:
        ids = tok(text)["input_ids"]
        cuts += [([0] * 8 + ids[:end])[-8:] for end in range(1, len(ids) + 1)]
    return torch.cat([every, torch.tensor(cuts), torch.tensor([[0] * 7 + [vocab + 5]])])  # and an id past the vocab


@pytest.mark.parametrize("stop", STOP_SETS, ids=repr)
def test_the_lookup_answers_exactly_what_transformers_criteria_answers(tok, stop):
    ids = rows(tok, stop)
    theirs = StopStringCriteria(tok, stop)(ids, None)
    ours = StopStrings(tok, stop)
    assert torch.equal(ours(ids, None), theirs)
    assert bool(theirs.any()) and not bool(theirs.all())  # the sets do match somewhere, and not everywhere
    for i in range(0, ids.shape[0], 997):  # and row by row (the CPU's shortcut is taken per call)
        assert torch.equal(ours(ids[i : i + 3], None), theirs[i : i + 3])


def test_single_character_stop_strings_are_one_lookup_and_longer_ones_keep_the_full_check(tok):
    assert StopStrings(tok, ["."]).exact and StopStrings(tok, ["!", "?", ";"]).exact
    assert not StopStrings(tok, [" the"]).exact and not StopStrings(tok, ["\n\n"]).exact


@pytest.mark.parametrize("stop", [[" the"], ["\n\n"], [".", " and"], ["the same", "he s"]], ids=repr)
def test_a_match_lies_in_the_rows_own_new_tokens(tok, stop):
    """`own`: the check answers what transformers' criteria answers on each row's new tokens alone."""
    ids = rows(tok, stop)
    own = torch.arange(ids.shape[0]) % ids.shape[1] + 1
    theirs = StopStringCriteria(tok, stop)
    expected = torch.tensor([bool(theirs(ids[i : i + 1, ids.shape[1] - n :], None)[0]) for i, n in enumerate(own)])
    assert torch.equal(StopStrings(tok, stop)(ids, None, own=own), expected)
    across = tok("I said the same")["input_ids"]  # "the" and " same" the two last tokens: a match over both
    assert bool(StopStringCriteria(tok, ["the same"])(torch.tensor([across]), None)[0])
    assert not StopStrings(tok, ["the same"])(torch.tensor([across]), None, own=torch.tensor([1]))[0]


@pytest.mark.parametrize(
    ("strategy", "params", "path"),
    [("greedy", {}, "decode"), ("top_k", {"k": 1}, "decode"), ("contrastive", {"alpha": 0.0}, "decode"),
     ("greedy", {}, "generate")],
)  # fmt: skip
def test_a_stop_string_begun_in_the_prompt_does_not_end_the_generation(tiny_model, runtime, strategy, params, path):
    """A prompt ending "the" with the stop string "the same": the generation went on past " same" (it ended
    there, with a text that holds no stop string, as `stop_string`); vLLM matches in the output only too."""
    from tests.support.engine import job, texts

    prompts = ["It was a truth universally acknowledged, and the", "She had never seen the"]
    free, _, _ = texts(runtime, job(tiny_model, "greedy", prompts=prompts, max_new=10))
    assert all(text.startswith(" same") for text in free)  # each prompt's "the" and its first token: "the same"
    stopped = job(tiny_model, strategy, params, prompts=prompts, max_new=10, stop=["the same"])
    if path == "generate":  # a static cache: transformers' generate() runs the job's batches
        stopped = stopped.model_copy(
            update={"generation": stopped.generation.model_copy(update={"static_cache": True})}
        )
    cut, records, result = texts(runtime, stopped)
    assert result.engine["plan"]["path"] == path
    assert cut == [text.split("the same")[0] for text in free]
    assert [r.stop_reason for r in records] == ["stop_string" if "the same" in t else "length" for t in free]
