"""Tasks (issue 38, parts 2 and 3): answers read by filters, accuracy and the multi-sample metrics
(pass@k, maj@k, distinct answers), McNemar's exact test, RE2's bounded time, the bad inputs' one line."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats as sps

from controller.cli import main
from controller.metrics import METRICS, cell_data, compute_metrics
from controller.metrics.answers import majority, pass_at_k
from controller.metrics.extract import TaskSpec, canonical_number, normalize, task_of
from controller.report.compute.cells import Settings, score
from controller.report.stats.cellstats import CellStats
from controller.report.stats.intervals import prompt_groups
from controller.report.stats.paired import compare_pair, mcnemar_p
from tests.support.repo import REPO
from tests.support.tasks import records, task_cell
from worker.core.contract import PromptItem

pytestmark = pytest.mark.pure


def answer(text: str, extract: list, choices=None, normalize_=None) -> str | None:
    doc = {"extract": extract} | ({"normalize": normalize_} if normalize_ is not None else {})
    return task_of(doc).answer(text, choices)


# -- extraction and normalisation -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, extract, expected",
    [
        ("so the answer is 42.", [{"regex": r"answer is (\S+)"}], "42"),
        ("The answer is: Paris!", [{"regex": r"answer is: (.*)"}], "paris"),
        ("#12 then #13", [{"regex": r"#(\d+)", "occurrence": "last"}], "13"),
        ("#12 then #13", [{"regex": r"#\d+", "group": 0}], "12"),
        ("7+8=15 4+3+1=8 #85", ["last_number"], "85"),
        ("about 1,234.50 apples and 3", ["first_number"], "1234.5"),
        ("no digits here", ["last_number"], None),
        ("\n\n  Rome \nand more", ["first_line"], "rome"),
        ("line one 12\nline two 99", ["first_line", "last_number"], "12"),
        ("nothing", [{"regex": r"answer: (\d+)"}, "last_number"], None),  # None ends the pipeline
        ("Answer: 3.0", ["last_number"], "3"),
        ("  Hello,   World!  ", [], "hello world"),
    ],
)
def test_filters_compose_and_normalise(text, extract, expected):
    assert answer(text, extract) == expected


@pytest.mark.parametrize(
    "text, choices, expected",
    [
        ("I think (B) is right", ["red", "green", "blue"], "b"),
        ("Answer: C.", ["red", "green", "blue"], "c"),
        ("maybe D", ["red", "green", "blue"], None),  # D is no choice of three
        ("it must be green", ["red", "green", "blue"], "b"),
        ("E) last", None, "e"),
    ],
)
def test_choice_letter(text, choices, expected):
    assert answer(text, ["choice_letter"], choices) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [("1,000", "1000"), ("3.0", "3"), ("+3.50", "3.5"), (".5", "0.5"), ("$12.", "12"), ("-0", "0"),
     ("1,00", None), ("12a", None), ("1e5", "100000"), ("2.5E-3", "0.0025"), ("1e1000", None)],
)  # fmt: skip
def test_number_formats(raw, expected):
    assert canonical_number(raw) == expected


def test_normalisation_steps_are_optional():
    assert normalize("  The  Answer, 1,000! ", ["case"]) == "  the  answer, 1,000! "
    assert normalize("The  Answer, 1,000!", ["punctuation"]) == "The Answer 1,000"  # a number kept whole
    assert normalize("1,000", ["numbers", "punctuation"]) == "1000"  # a number keeps its comma's meaning
    assert normalize("Ünïcode CASE", ["case", "whitespace"]) == "ünïcode case"


def test_gold_answers_letters_and_choice_texts():
    task = task_of(None)
    assert task.accepted(["1,000", "one thousand"]) == {"1000", "one thousand"}
    assert task.accepted(["green"], ["red", "green"]) == {"green", "b"}
    assert task.accepted(["B"], ["red", "green"]) == {"green", "b"}


def test_numbers_in_free_text_keep_their_sign_and_separators():
    task = task_of(None)
    assert task.answer("-5 degrees") not in task.accepted(["5 degrees"])
    assert task.answer("1,000 apples.") in task.accepted(["1000 apples"])
    assert task.answer("It is (-3.50)!") == "it is -3.5" and task.answer("pages 10-20") == "pages 10 20"
    assert normalize("-5 degrees, 1,000 apples", ["punctuation"]) == "-5 degrees 1,000 apples"


def test_a_gold_number_in_exponent_notation_matches_its_digits():
    task = task_of(None)
    assert task.answer("10000000000000000") in task.accepted(["1e16"])
    assert task.answer("1e16") in task.accepted(["10000000000000000"])
    assert task.answer("0.00001") in task.accepted(["1E-5"])


def test_a_lowercase_gold_letter_accepts_its_choice_where_case_is_normalised():
    assert task_of(None).accepted(["b"], ["shark", "whale", "trout"]) == {"b", "whale"}
    assert task_of(None).accepted(["(b)"], ["shark", "whale", "trout"]) == {"b", "whale"}
    assert task_of({"normalize": ["whitespace"]}).accepted(["b"], ["shark", "whale"]) == {"b"}  # case kept
    # a gold that is a choice's text is that choice, not also a letter: gold `a` of [x, a, y] is B, never A's x
    assert task_of(None).accepted(["a"], ["x", "a", "y"]) == {"a", "b"}


def test_prompt_items_take_one_or_several_answers():
    assert PromptItem(id="a", prompt="x", answer=42).answer == ["42"]
    assert PromptItem(id="a", prompt="x", answer=["4", "four"]).answer == ["4", "four"]
    assert "answer" not in PromptItem(id="a", prompt="x").model_dump()  # old sweeps keep their ids


# -- RE2: a user's regex cannot hang anything ----------------------------------------------------


def test_a_catastrophically_backtracking_regex_runs_in_linear_time():
    """`(a+)+$` on 'aaa…a!' backtracks exponentially under Python's re (2^n paths for n a's); RE2 has no
    backtracking, so this finishes at once. The timeout only bounds the failure mode of a backtracking engine."""
    code = (
        "from controller.metrics.extract import task_of\n"
        "t = task_of({'extract': [{'regex': '(a+)+$'}]})\n"
        "print(t.answer('a' * 200_000 + '!'), t.answer('a' * 40 + 'b' * 0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "a" * 40]


def test_what_re2_cannot_run_is_refused_in_one_line():
    with pytest.raises(ValueError, match="RE2 cannot compile"):
        TaskSpec.model_validate({"extract": [{"regex": r"(?<=x)\d+"}]})
    with pytest.raises(ValueError, match="group 2 asked, but the pattern has 1"):
        TaskSpec.model_validate({"extract": [{"regex": r"(\d+)", "group": 2}]})


# -- the metrics against hand computations -----------------------------------------------------


@pytest.mark.parametrize("n, c, k", [(10, 3, 1), (5, 2, 2), (8, 0, 8), (8, 1, 8), (20, 5, 10), (4, 4, 2), (7, 3, 5)])
def test_pass_at_k_is_the_published_formula(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_accuracy_answered_pass_and_majority_by_hand():
    cell = task_cell(
        {
            "p1": (["#5", "#5", "#6", "none"], ["5"]),  # 2 of 4 right, 3 answered; majority 5 (right)
            "p2": (["#7", "#8", "#8", "#9"], ["7"]),  # 1 of 4 right; majority 8 (wrong)
            "p3": (["#1", "#2", "#2", "#1"], ["2"]),  # 2 of 4 right; tie 1 vs 2: "1" first in code-point order
            "p4": (["#3", "x", "y", "z"], None),  # no gold: counts for answered and distinct only
        }
    )
    names = ["exact_match", "answered", "pass@1", "pass@2", "pass@4", "maj@4", "maj@2", "distinct_answers"]
    v = compute_metrics(cell, names)
    assert v["exact_match"] == pytest.approx(5 / 12)
    assert v["answered"] == pytest.approx(12 / 16)
    assert v["pass@1"] == pytest.approx((2 / 4 + 1 / 4 + 2 / 4) / 3)
    p2 = [1 - math.comb(4 - c, 2) / math.comb(4, 2) for c in (2, 1, 2)]
    assert v["pass@2"] == pytest.approx(sum(p2) / 3)
    assert v["pass@4"] == pytest.approx(1.0)
    assert v["maj@4"] == pytest.approx(1 / 3)  # p1 only (p3's tie goes to "1", wrong)
    # maj@2: the two smallest seeds: p1 (5, 5) right; p2 (7, 8) tie -> "7" right; p3 (1, 2) tie -> "1" wrong
    assert v["maj@2"] == pytest.approx(2 / 3)
    assert v["distinct_answers"] == pytest.approx((2 / 4 + 3 / 4 + 2 / 4 + 1 / 4) / 4)


def test_majority_ties_and_silence():
    assert majority(["b", "a", "b", "a", None, None, None]) == "a"
    assert majority([None, None]) is None
    assert majority(["10", "9"]) == "10"  # code-point order, documented


def test_order_of_the_generations_does_not_matter():
    per = {"p1": (["#5", "#6", "#5", "#7"], ["5"]), "p2": (["#1", "#1", "#2", "#2"], ["2"])}
    names = ["exact_match", "pass@2", "maj@3", "distinct_answers"]
    a = compute_metrics(task_cell(per), names)
    shuffled = records(per)[::-1]
    cell = cell_data(shuffled)
    cell.task = {"extract": ["last_number"]}
    assert compute_metrics(cell, names) == pytest.approx(a)


def test_fewer_generations_than_k_leave_pass_and_maj_empty():
    cell = task_cell({"p1": (["#5"], ["5"]), "p2": (["#1"], ["2"])})
    v = compute_metrics(cell, ["exact_match", "pass@2", "maj@2", "distinct_answers"])
    assert v == {"exact_match": 0.5, "pass@2": None, "maj@2": None, "distinct_answers": None}


def test_a_cell_without_a_task_is_empty_not_zero():
    cell = cell_data([{"text": "#5", "prompt_id": "p"}])
    assert compute_metrics(cell, ["exact_match", "answered", "pass@1"]) == {
        "exact_match": None, "answered": None, "pass@1": None
    }  # fmt: skip


def test_family_members_are_made_once_and_unknown_names_list_the_families():
    assert METRICS.get("pass@8") is METRICS.get("pass@8")
    assert "maj@16" in METRICS and "pass@0" not in METRICS and "pass@08" not in METRICS and "pass@x" not in METRICS
    assert "pass@8" not in METRICS.names()  # a sweep's default (every metric) has no k
    assert "maj@<k>, pass@<k>" in METRICS.unknown_message("pass@0")


# -- paired comparisons: McNemar's exact test ---------------------------------------------------


def test_mcnemar_is_the_mid_p_of_scipys_binomial_test_on_discordant_pairs():
    """McNemar's mid-p (issue 46: the exact test rejected a true null in 1.0% of simulations at 16 prompts):
    the exact binomial p of the discordant prompts less the probability of the observed count."""
    rng = np.random.default_rng(3)
    a = (rng.random(60) < 0.7).astype(float)
    b = (rng.random(60) < 0.5).astype(float)
    sa, sb = np.column_stack([a, np.ones(60)]), np.column_stack([b, np.ones(60)])
    only_a, only_b = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    n = only_a + only_b
    exact = sps.binomtest(only_a, n, 0.5).pvalue
    assert mcnemar_p(sa, sb) == pytest.approx(exact - sps.binom.pmf(only_a, n, 0.5))
    # by hand: 1 against 9 discordant prompts, exact p = 2 * (1 + 10) / 2^10, mid-p = 2 * (1 + 10 / 2) / 2^10
    one = np.array([[1, 1]] + [[0, 1]] * 9 + [[1, 1]] * 5, dtype=float)
    other = np.array([[0, 1]] + [[1, 1]] * 9 + [[1, 1]] * 5, dtype=float)
    assert mcnemar_p(one, other) == pytest.approx(12 / 1024)
    assert mcnemar_p(one[:2], one[:2]) == 1.0  # no discordant prompt
    # as many discordant prompts each way: no difference, p 1 (binomtest caps its exact p at 1 there, so the
    # exact p less the probability of the count was 0.5, 0.625, 0.6875 at 1, 2, 3 a way)
    for k in (1, 2, 3, 5):
        a_right = np.array([[1, 1]] * k + [[0, 1]] * k + [[1, 1]] * 4, dtype=float)
        b_right = np.array([[0, 1]] * k + [[1, 1]] * k + [[1, 1]] * 4, dtype=float)
        assert mcnemar_p(a_right, b_right) == pytest.approx(1.0)
    # 3 against 1: 2 · P(X < 1) + P(X = 1) of Binomial(4, ½) = (2 + 4) / 16
    three, one_way = np.array([[1, 1]] * 3 + [[0, 1]], dtype=float), np.array([[0, 1]] * 3 + [[1, 1]], dtype=float)
    assert mcnemar_p(three, one_way) == pytest.approx(6 / 16)


def test_exact_match_of_single_generations_is_compared_by_mcnemar():
    m = METRICS.get("exact_match")
    n = 15
    a = np.array([[1, 1]] + [[0, 1]] * 9 + [[1, 1]] * 5, dtype=float)
    b = np.array([[0, 1]] + [[1, 1]] * 9 + [[1, 1]] * 5, dtype=float)
    prompts = [f"p{i}" for i in range(n)]
    cell_a = CellStats("a", "m", "greedy", prompts, {"exact_match": 6 / 15}, {"exact_match": ("sums", a)})
    cell_b = CellStats("b", "m", "beam", prompts, {"exact_match": 14 / 15}, {"exact_match": ("sums", b)})
    out = compare_pair(cell_a, cell_b, {"exact_match": m}, n_boot=200, rng=np.random.default_rng(0))
    assert out["exact_match_diff"] == pytest.approx(-8 / 15)
    assert out["exact_match_diff_p"] == pytest.approx(12 / 1024)


def test_counts_of_outcomes_over_seeds_get_the_exact_mid_p_of_the_permutation_test():
    """issue 46: 0/1 outcomes, 3 generations a prompt: the paired permutation test's statistic takes few values,
    and the plain p counts every tie with the observed one as extreme (conservative). The p is the mid-p of the
    exact permutation distribution, checked against its enumeration by hand; the plain p is larger."""
    m = METRICS.get("eos_rate")
    right_a, right_b = [3, 2, 3, 1, 3, 2], [1, 2, 0, 1, 2, 0]
    a = np.array([[k, 3] for k in right_a], dtype=float)
    b = np.array([[k, 3] for k in right_b], dtype=float)
    prompts = [f"p{i}" for i in range(6)]
    cell_a = CellStats("a", "m", "x", prompts, {"eos_rate": 14 / 18}, {"eos_rate": ("sums", a)})
    cell_b = CellStats("b", "m", "y", prompts, {"eos_rate": 6 / 18}, {"eos_rate": ("sums", b)})
    out = compare_pair(cell_a, cell_b, {"eos_rate": m}, n_boot=200, rng=np.random.default_rng(0))
    observed = (sum(right_a) - sum(right_b)) / 18
    null = [
        sum((x - y) if keep else (y - x) for keep, x, y in zip(swap, right_a, right_b)) / 18
        for swap in itertools.product([True, False], repeat=6)
    ]  # the 64 arrangements of the six prompts' pairs
    above = sum(v > observed + 1e-12 for v in null)
    below = sum(v < observed - 1e-12 for v in null)
    equal = 64 - above - below
    assert out["eos_rate_diff"] == pytest.approx(observed)
    assert out["eos_rate_diff_p"] == pytest.approx(2 * (min(above, below) + equal / 2) / 64)
    assert out["eos_rate_diff_p"] < 2 * (min(above, below) + equal) / 64  # the plain p, ties counted whole


def scored(cell, key: str, names: list[str]) -> CellStats:
    """What the report keeps of a task cell for its comparisons (`cells.score`)."""
    settings = Settings(tuple(names), with_ci=True, n_boot=2, n_boot_corpus=2, seed=0, sample_size=None)
    prompts = list(dict.fromkeys(cell.prompt_ids))
    row = {"model": "m", "strategy": key}
    selected = [(n, METRICS.get(n)) for n in names]
    return score(selected, settings, row, cell, prompt_groups(cell.prompt_ids), key, prompts=prompts)[1]


def test_pass_at_1_of_samples_against_one_generation_is_tested_as_exact_match_is():
    """issue 46: pass@1 of 8 samples a prompt against greedy's one generation is exact_match's share, prompt by
    prompt (c / 8 against 0 or 1), and its paired test is now exact_match's: the same exact mid-p of the 2^12
    arrangements. Before, the per-prompt sums (c / 8, 1) were divided by the 8 generations again, so a swapped
    prompt weighed 8 times its neighbours: p 0.98 where exact_match's was 0.59 on the task sweep, and under a true
    null (8 v 1, 32 prompts, 1,000 simulations) a test that never rejected (0.0%, exact_match 4.3%)."""
    assert all(METRICS.get(name).per_prompt for name in ["pass@1", "pass@4", "maj@2", "distinct_answers"])
    assert not METRICS.get("exact_match").per_prompt  # per generation: (right, 1) each
    rng = np.random.default_rng(7)
    prompts = [f"p{i}" for i in range(12)]
    gold = {p: str(i) for i, p in enumerate(prompts)}
    right = {p: rng.random() for p in prompts}

    def texts(p: str, n: int) -> list[str]:
        return [f"#{gold[p]}" if rng.random() < right[p] else "#x" for _ in range(n)]

    names = ["exact_match", "pass@1"]
    sampled = task_cell({p: (texts(p, 8), [gold[p]]) for p in prompts})
    greedy = task_cell({p: (texts(p, 1), [gold[p]]) for p in prompts})
    cell_a, cell_b = scored(sampled, "top_p", names), scored(greedy, "greedy", names)
    assert cell_a.prompts == prompts and cell_a.generations == [8] * 12 and cell_b.generations == [1] * 12
    out = {
        name: compare_pair(cell_a, cell_b, {name: METRICS.get(name)}, n_boot=4096, rng=np.random.default_rng(0))
        for name in names
    }
    em, p1 = out["exact_match"], out["pass@1"]
    assert p1["pass@1_diff"] == pytest.approx(em["exact_match_diff"])
    assert p1["pass@1_diff_p"] == pytest.approx(em["exact_match_diff_p"])
    # by hand: the exact mid-p of the 2^12 arrangements of each prompt's (c / 8, greedy's outcome)
    share_a = cell_a.kept["exact_match"][1][:, 0] / 8
    share_b = cell_b.kept["exact_match"][1][:, 0]
    null = np.array(
        [
            np.where(s, share_b - share_a, share_a - share_b).sum() / 12
            for s in itertools.product([False, True], repeat=12)
        ]
    )
    observed = (share_a - share_b).sum() / 12
    tol = 1e-12
    above, below = np.sum(null > observed + tol), np.sum(null < observed - tol)
    equal = len(null) - above - below
    assert p1["pass@1_diff_p"] == pytest.approx(min(1.0, 2 * (min(above, below) + equal / 2) / len(null)))


# -- bad input: one line each -------------------------------------------------------------------

SPEC = """
name: t
models:
  - path: {model}
prompts:
  inline: [{{id: a, prompt: "1+1=?", answer: 2}}, {{id: b, prompt: "2+2=?", answer: "4"}}]
strategies:
  - name: greedy
  - name: top_p
generation:
  max_new_tokens: 8
  seeds: [0, 1]
metrics: [exact_match, maj@2]
"""


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("maj@2]", "pass@4]", "metrics[1]: pass@4 needs 4 generations of each prompt, but the sweep's strategies "
         "make at most 2"),
        ("  - name: top_p\n", "", "metrics[1]: maj@2 needs 2 generations of each prompt, but the sweep's strategies "
         "make 1"),
        (', answer: 2}, {id: b, prompt: "2+2=?", answer: "4"}', '}, {id: b, prompt: "2+2=?"}',
         "metrics: exact_match needs the prompts' gold `answer`, but no prompt of prompts.inline has one"),
        ("maj@2]", "maj@2]\ntask: {extract: [{regex: '(?=x)'}]}", "task.extract[0].regex.regex: RE2 cannot compile"),
        ("maj@2]", "maj@2]\ntask: {extract: [nearest_number]}", "task.extract"),
        ("maj@2]", "pass@0]", "unknown metric 'pass@0'"),
        ('answer: "4"', "answer: []", "`answer` must be a non-empty string or number"),
        ('answer: "4"', 'answer: "4", choices: [only]', "`choices` must be a list of 2 to 26"),
        ("maj@2]", "bleu]", "metrics: bleu needs the prompts' `reference`, but no prompt of prompts.inline has one"),
        ("maj@2]", "mauve]", "metrics: mauve needs a `featurizer:` model (docs/sweeps.md), and the sweep has none"),
    ],
    ids=["k>n", "maj without sampling", "no answer", "re2 refuses", "unknown filter", "pass@0", "empty answer",
         "one choice", "no reference", "no featurizer"],
)  # fmt: skip
def test_bad_task_input_is_one_line_and_exit_2(tmp_path, old, new, expected):
    (tmp_path / "config.json").write_text("{}")
    text = SPEC.format(model=tmp_path)
    assert old in text, old
    spec = tmp_path / "spec.yaml"
    spec.write_text(text.replace(old, new))
    result = CliRunner().invoke(main, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expected in lines[0], lines[0]


def test_the_metrics_command_lists_the_task_metrics_and_families():
    out = CliRunner().invoke(main, ["metrics"]).output
    assert "exact_match  (sequence, higher is better; needs answers" in out
    # the interval the report gives it (it said "bootstrap interval", which a share of answers never gets)
    flat = " ".join(out.split())
    assert "one answer a prompt, Korn-Graubard's with several" in flat.split("exact_match (", 1)[1].split("):")[0]
    assert "pass@<k>" in out and "Chen et al. 2021" in out and "maj@<k>" in out and "Wang et al. 2023" in out
