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
