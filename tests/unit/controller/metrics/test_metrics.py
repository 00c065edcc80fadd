"""Quality metrics: hand-computed values, edge cases, and agreement with the reference libraries."""

from __future__ import annotations

import math
import random
import unicodedata

import pytest

from controller.metrics import compute_metrics
from controller.metrics.reference import bleu_signature
from controller.metrics.selfbleu import self_bleu, self_bleu_leave_one_out, self_bleu_scores
from controller.metrics.tokenize import ngrams, word_tokenize
from controller.metrics.zipf import zipf_coefficient, zipf_leave_one_out
from tests.support.metrics import cell, value

pytestmark = pytest.mark.pure

# --- tokenizer ----------------------------------------------------------------------------


def test_word_tokenize_lowercases_and_splits_punctuation():
    assert word_tokenize("Hello, World! It's 3.5 km -- don’t.") == [
        "hello", ",", "world", "!", "it's", "3", ".", "5", "km", "-", "-", "don’t", ".",
    ]  # fmt: skip
    assert word_tokenize("") == [] and word_tokenize("  \n\t ") == []


def test_word_tokenize_keeps_combining_marks_inside_their_word():
    # Python re's \w has no combining mark: a Devanagari vowel sign or virama, a decomposed accent, a Persian
    # zero-width non-joiner split the word and were each counted as a punctuation token
    assert word_tokenize("हिन्दी भाषा") == ["हिन्दी", "भाषा"]
    decomposed = unicodedata.normalize("NFD", "café résumé")  # no normalisation: each word as written
    assert word_tokenize(decomposed.upper()) == decomposed.split()
    assert word_tokenize("می\u200cخواهم") == ["می\u200cخواهم"]
    c = cell("हिन्दी भाषा बोलते हैं", "हिन्दी भाषा")
    assert value("mean_length", c) == 3.0 and value("distinct_1", c) == 4 / 6


def test_word_tokenize_splits_cjk_into_characters():
    # Chinese and Japanese are written without spaces: a whole sentence was one "word" (rep-n and distinct-2
    # empty, a mean length of one word a sentence); each character is a token, as BERT's and sacrebleu's zh
    assert word_tokenize("我爱北京。東京は日本") == ["我", "爱", "北", "京", "。", "東", "京", "は", "日", "本"]
    assert word_tokenize("foo北京bar コーヒー") == ["foo", "北", "京", "bar", "コ", "ー", "ヒ", "ー"]
    c = cell("北京北京北京", "我爱北京")
    assert value("mean_length", c) == 5.0 and value("rep_2", c) == 1 - (2 + 3) / (5 + 3)


def test_ngrams_never_longer_than_the_sequence():
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a"], 2) == []


# --- hand-computed example: g1 = "a b a b a", g2 = "a b c" -------------------------------

ABAB = cell("A b a b a", "a b c")  # lowercased by the tokenizer


def test_repetition_hand_computed():
    # g1 bigrams ab ba ab ba (4, 2 unique); g2 ab bc (2, 2 unique): rep_2 = 1 - 4/6
    assert value("rep_2", ABAB) == pytest.approx(1 / 3)
    # g1 trigrams aba bab aba (3, 2 unique); g2 abc (1, 1): rep_3 = 1 - 3/4
    assert value("rep_3", ABAB) == pytest.approx(1 / 4)
    # g1 4-grams abab baba (2, 2 unique); g2 has none: rep_4 = 1 - 2/2
    assert value("rep_4", ABAB) == 0.0
    # diversity = (1 - 1/3)(1 - 1/4)(1 - 0) = 2/3 * 3/4 = 1/2
    assert value("diversity", ABAB) == pytest.approx(1 / 2)


def test_distinct_hand_computed():
    # unigrams: {a, b, c} over 5 + 3 = 8 -> 3/8
    assert value("distinct_1", ABAB) == pytest.approx(3 / 8)
    # bigrams: {ab, ba, bc} over 4 + 2 = 6 -> 1/2 (ab is shared by g1 and g2, counted once)
    assert value("distinct_2", ABAB) == pytest.approx(1 / 2)
    # trigrams: {aba, bab, abc} over 3 + 1 = 4 -> 3/4
    assert value("distinct_3", ABAB) == pytest.approx(3 / 4)


def test_mean_length_in_words():
    # (5 + 3) / 2 words; punctuation counts as a word: "hi ." is 2
    assert value("mean_length", ABAB) == 4.0
    assert value("mean_length", cell("Hi.", "")) == 1.0  # (2 + 0) / 2


def test_mean_new_tokens_and_eos_rate():
    c = cell("a", "b", "c", "d", n_new_tokens=[3, 5, 7, 9], stop_reason=["eos", "length", "eos", "stop_string"])
    assert value("mean_new_tokens", c) == 6.0  # (3 + 5 + 7 + 9) / 4
    assert value("eos_rate", c) == 0.5  # 2 of 4 stopped at EOS
    reference_row = cell("a", "b")
    assert value("eos_rate", reference_row) is None and value("mean_new_tokens", reference_row) is None


def test_zipf_hand_computed():
    # counts a:4, b:1 -> points (ln 1, ln 4), (ln 2, ln 1): slope = (0 - ln 4) / (ln 2 - 0) = -2
    assert value("zipf", cell("a a b", "a a")) == pytest.approx(2.0)
    # a flat distribution has slope 0 (and no negative zero):
    assert math.copysign(1, value("zipf", cell("a b c"))) == 1.0 and value("zipf", cell("a b c")) == 0.0
    # Only the top-N ranks enter: with N = 2, counts 4, 1, 1 fit like 4, 1 -> 2
    assert zipf_coefficient([["x"] * 4 + ["y", "z"]], top_n=2) == pytest.approx(2.0)


def test_perplexity_is_token_weighted():
    # exp((2 + 4) / (2 + 4)) = e
    assert value("perplexity", cell("a", "b", nll_sum=[2.0, 4.0], nll_count=[2, 4])) == pytest.approx(math.e)
    # exp((1 + 8) / (1 + 2)) = e^3 (the mean of per-generation perplexities would be (e + e^4) / 2)
    assert value("perplexity", cell("a", "b", nll_sum=[1.0, 8.0], nll_count=[1, 2])) == pytest.approx(math.e**3)
    assert value("perplexity", cell("a", "b", nll_sum=[1.0, None], nll_count=[1, None])) is None
    assert value("perplexity", cell("", nll_sum=[0.0], nll_count=[0])) is None
    assert value("perplexity", cell("a", "b")) is None
    # a mean NLL past ~709.8 nats (a scorer that gave the tokens no probability) is inf, not an OverflowError
    assert value("perplexity", cell("a", "b", nll_sum=[800.0, 1600.0], nll_count=[1, 2])) == math.inf


# --- self-BLEU: hand-computed, then against NLTK --------------------------------------------


def test_self_bleu_hand_computed_full_overlap_but_one_word():
    # g1 = a b c d e, g2 = a b c d f; each against the other: p1..p4 = 4/5, 3/4, 2/3, 1/2, equal
    # lengths so BP = 1: BLEU = (4/5 * 3/4 * 2/3 * 1/2) ** (1/4) = (1/5) ** (1/4), both ways
    assert value("self_bleu_4", cell("a b c d e", "a b c d f")) == pytest.approx(0.2**0.25, abs=1e-12)


def test_self_bleu_hand_computed_smoothing_and_brevity():
    # hyp a b vs ref a c d: p1 = 1/2, p2 = 0/1 -> 0.1/1, p3 = p4 = 0/max(1, 0) -> 0.1; c = 2 < r = 3:
    #   BP = exp(1 - 3/2); BLEU = exp(-0.5) * (0.5 * 0.1**3) ** 0.25
    first = math.exp(-0.5) * (0.5 * 0.1**3) ** 0.25
    # hyp a c d vs ref a b: p1 = 1/3, p2 = 0/2 -> 0.1/2, p3 = 0/1 -> 0.1, p4 -> 0.1; c = 3 > r = 2: BP = 1
    second = (1 / 3 * 0.05 * 0.1 * 0.1) ** 0.25
    assert self_bleu_scores([["a", "b"], ["a", "c", "d"]]) == pytest.approx([first, second], abs=1e-12)
    assert value("self_bleu_4", cell("a b", "a c d")) == pytest.approx((first + second) / 2, abs=1e-12)


def test_self_bleu_brevity_tie_takes_the_shorter_reference():
    # hyp a b c d; others a b c (length 3) and a b c d x (length 5): both 1 away, NLTK takes 3,
    # so c = 4 > r = 3 and BP = 1; precisions all 1 (from the second) -> BLEU 1.0
    # (taking 5 would give exp(1 - 5/4))
    assert self_bleu_scores([["a", "b", "c", "d"], ["a", "b", "c"], ["a", "b", "c", "d", "x"]])[0] == 1.0


@pytest.mark.parametrize("size", [1, 2, 3])
def test_self_bleu_leave_one_out_is_self_bleu_of_each_remainder_bit_for_bit(size):
    """Each group's value is the mean self_bleu computes on the rest, to the last bit, where the group held the
    only other document of a hypothesis's closest length (its brevity penalty changes), the largest count of
    its n-grams (its clipping changes), or neither (its old score stands)."""
    rng = random.Random(size)
    words = ["the", "a", "of", "and", "to", "in", "was", "she", "he", "it", "her", "his", "that", "with"]
    for trial in range(12):
        n_groups = rng.randint(2, 9)
        spread = 3 if trial % 2 else 25  # few lengths (shared) or many (mostly unique: brevity penalties move)
        docs = [[rng.choice(words[: rng.randint(2, len(words))]) for _ in range(rng.randint(0, spread))]
                for _ in range(n_groups * size)]  # fmt: skip
        groups = [list(range(g * size, (g + 1) * size)) for g in range(n_groups)]
        fast = self_bleu_leave_one_out(docs, groups)
        for g, members in enumerate(groups):
            rest = [d for i, d in enumerate(docs) if i not in members]
            expected = self_bleu(rest)
            assert (math.isnan(fast[g]) and expected is None) or fast[g] == expected, (trial, g)


@pytest.mark.parametrize("size, top_n", [(1, 5000), (3, 5000), (2, 6)])
def test_zipf_leave_one_out_is_the_coefficient_of_each_remainder_bit_for_bit(size, top_n):
    """Each group's value is zipf_coefficient of the rest to the last bit: where the group held a word's every
    occurrence (it leaves the counts), some of them (it moves to a lower count), a top_n cut (6: the runs of
    equal counts cut inside one), and where too few distinct words are left (NaN, as None)."""
    rng = random.Random(size * 100 + top_n)
    words = [f"w{i}" for i in range(40)]
    for trial in range(10):
        n_groups = rng.randint(2, 8)
        docs = [[rng.choice(words[: rng.randint(1, 40)]) for _ in range(rng.randint(0, 30))]
                for _ in range(n_groups * size)]  # fmt: skip
        groups = [list(range(g * size, (g + 1) * size)) for g in range(n_groups)]
        fast = zipf_leave_one_out(docs, groups, top_n)
        for g, members in enumerate(groups):
            expected = zipf_coefficient([d for i, d in enumerate(docs) if i not in members], top_n)
            assert (math.isnan(fast[g]) and expected is None) or fast[g] == expected, (trial, g)


def test_self_bleu_edge_cases():
    assert value("self_bleu_4", cell("only one generation here")) is None
    assert value("self_bleu_4", cell()) is None
    assert value("self_bleu_4", cell("the cat sat on the mat", "The cat sat on the mat.".rstrip("."))) == 1.0
    # an empty hypothesis scores 0; "a b c" has no unigram in common with "" -> 0 too
    assert value("self_bleu_4", cell("", "a b c")) == 0.0
    # a hypothesis shorter than 4 words with a unigram match is smoothed, not zero
    assert value("self_bleu_4", cell("a", "a b")) > 0


def _random_docs(count: int, seed: int) -> list[list[str]]:
    """Deterministic generations over a Zipf-ish vocabulary, with duplicates, empties and tiny ones."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(60)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    docs = [rng.choices(vocab, weights, k=rng.randint(0, 30)) for _ in range(count)]
    return docs + [docs[3][:], docs[3][:], [], ["w0"], ["w0", "w1"], ["zzz", "yyy"]]


def test_self_bleu_equals_nltk_texygen():
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    docs = _random_docs(50, seed=7)
    smooth = SmoothingFunction().method1
    expected = [
        sentence_bleu(docs[:i] + docs[i + 1 :], hyp, weights=(0.25,) * 4, smoothing_function=smooth)
        for i, hyp in enumerate(docs)
    ]
    assert self_bleu_scores(docs) == pytest.approx(expected, abs=1e-12)
    assert abs(self_bleu(docs) - sum(expected) / len(expected)) < 1e-9


# --- reference-based: equal to the libraries' own outputs ----------------------------------

HYPS = ["The cat sat on the mat today.", "Dogs are barking loudly at night", "", "A quick brown fox jumps."]
REFS = ["The cat is sitting on the mat.", "The dogs barked at night.", "Something.", "The quick brown fox jumped."]


def test_bleu_equals_sacrebleu():
    import sacrebleu

    expected = sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert value("bleu", cell(*HYPS, reference=REFS)) == expected
    assert value("bleu", cell("the same four words", reference=["the same four words"])) == pytest.approx(100.0)
    assert bleu_signature().startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")


def test_rouge_equals_rouge_score():
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(HYPS, REFS)]
    c = cell(*HYPS, reference=REFS)
    for name, key in [("rouge_1", "rouge1"), ("rouge_2", "rouge2"), ("rouge_l", "rougeL")]:
        assert value(name, c) == pytest.approx(sum(s[key].fmeasure for s in scores) / len(scores), abs=1e-15)


def test_reference_metrics_use_only_generations_with_a_reference():
    import sacrebleu

    c = cell(*HYPS, reference=[REFS[0], None, REFS[2], None])
    assert value("bleu", c) == sacrebleu.corpus_bleu([HYPS[0], HYPS[2]], [[REFS[0], REFS[2]]]).score
    no_refs = cell(*HYPS)
    for name in ["bleu", "rouge_1", "rouge_2", "rouge_l"]:
        assert value(name, no_refs) is None


# --- edge cases across every metric ---------------------------------------------------------


def test_empty_cell_is_empty_everywhere():
    assert all(v is None for v in compute_metrics(cell()).values())


def test_generations_shorter_than_n():
    c = cell("a", "b")
    assert value("rep_2", c) is None and value("distinct_2", c) is None and value("diversity", c) is None
    assert value("distinct_1", c) == 1.0  # 2 unique of 2
    assert value("self_bleu_4", c) == 0.0  # no unigram in common


def test_empty_generation_among_others():
    c = cell("", "a b c")
    assert value("rep_2", c) == 0.0  # "" adds no bigram; ab bc: 2 unique of 2
    assert value("distinct_1", c) == 1.0  # 3 of 3
    assert value("mean_length", c) == 1.5  # (0 + 3) / 2


def test_all_identical_generations():
    c = cell(*["The cat sat on the mat"] * 3)
    assert value("rep_2", c) == 0.0  # within each: the-cat cat-sat sat-on on-the the-mat, all unique
    assert value("distinct_1", c) == pytest.approx(5 / 18)  # {the cat sat on mat} over 3 * 6 words
    assert value("distinct_2", c) == pytest.approx(5 / 15)  # 5 bigrams over 3 * 5
    assert value("self_bleu_4", c) == 1.0
    # counts the:6, cat/sat/on/mat:3 -> y = ln 6, ln 3 x4 over x = ln 1..ln 5
    xs = [math.log(r) for r in range(1, 6)]
    ys = [math.log(6)] + [math.log(3)] * 4
    xm, ym = sum(xs) / 5, sum(ys) / 5
    slope = sum((x - xm) * (y - ym) for x, y in zip(xs, ys)) / sum((x - xm) ** 2 for x in xs)
    assert value("zipf", c) == pytest.approx(-slope)


# --- cell_data and shards -------------------------------------------------------------------


def test_self_bleu_rejects_tokens_with_spaces():
    # n-grams are keyed by space-joined strings: "a b" + "c" must not collide with "a" + "b c"
    with pytest.raises(ValueError, match="spaces"):
        self_bleu([["a b", "c"], ["a", "b c"]])
