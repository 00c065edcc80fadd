"""Self-BLEU-4: decodebench's linear implementation against Texygen-style NLTK, side by side.

    python benchmarks/bench_self_bleu.py                 # 1,000 synthetic generations of 64 words
    python benchmarks/bench_self_bleu.py --n 1000        # the full side-by-side (about 3 min of NLTK)
    python benchmarks/bench_self_bleu.py --file gens.txt # one generation per line

Ours runs on all the generations. The Texygen-style reference (each generation against
all the others with NLTK's `sentence_bleu`, uniform weights, `SmoothingFunction().method1`)
is quadratic, so by default it runs on the first `--n` generations, and also on half of
them to measure how its time grows; ours runs on the same subsamples. The script asserts
that both give the same value (|diff| < 1e-9) on every subsample and prints values, times,
the speed ratio and the measured scaling exponents (time ∝ size^k).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu  # imported before any timing

from controller.metrics.selfbleu import self_bleu
from controller.metrics.tokenize import word_tokenize


def synthetic(count: int, length: int, vocab_size: int, seed: int) -> list[list[str]]:
    """Deterministic generations of `length` words drawn with Zipf-ish (1/r^1.1) weights."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocab_size)]
    weights = [1.0 / (r + 1) ** 1.1 for r in range(vocab_size)]
    return [rng.choices(vocab, weights, k=length) for _ in range(count)]


def nltk_self_bleu(docs: list[list[str]]) -> float:
    """Texygen's SelfBleu (hypothesis excluded from its references) on NLTK's sentence_bleu."""
    smooth = SmoothingFunction().method1
    scores = [
        sentence_bleu(docs[:i] + docs[i + 1 :], hyp, weights=(0.25,) * 4, smoothing_function=smooth)
        for i, hyp in enumerate(docs)
    ]
    return sum(scores) / len(scores)


def timed(fn: Callable[[list[list[str]]], float], docs: list[list[str]], repeat: int = 1) -> tuple[float, float, float]:
    """(result, CPU seconds, wall seconds) of the run with the least CPU time of `repeat` runs.

    Both implementations are single-threaded pure Python, so the process's CPU time is
    the work done; on a shared machine it is much less noisy than wall time.
    """
    best = (math.inf, math.inf)
    for _ in range(repeat):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = fn(docs)
        best = min(best, (time.process_time() - cpu0, time.perf_counter() - wall0))
    return result, *best


def exponent(t_small: float, t_big: float, n_small: int, n_big: int) -> float:
    return math.log(t_big / t_small) / math.log(n_big / n_small)


def side_by_side(docs, n: int, full_time: float) -> None:
    """Ours against NLTK on the first n/2 and n generations: values, times, scaling."""
    sizes = [n // 2, n]
    rows = []
    for size in sizes:
        sub = docs[:size]
        ours, t_ours, w_ours = timed(self_bleu, sub, repeat=3)
        ref, t_ref, w_ref = timed(nltk_self_bleu, sub)
        diff = abs(ours - ref)
        rows.append((size, t_ours, t_ref))
        print(
            f"n = {size:5d}:  ours {ours:.12f} in {t_ours:6.3f} s ({w_ours:6.3f} s)   "
            f"nltk {ref:.12f} in {t_ref:7.2f} s ({w_ref:7.2f} s)   |diff| = {diff:.1e}   "
            f"nltk/ours = {t_ref / t_ours:5.0f}x"
        )
        assert diff < 1e-9, f"self-BLEU differs from NLTK by {diff} on {size} generations"

    (n0, o0, r0), (n1, o1, r1) = rows
    k_ref, k_ours = exponent(r0, r1, n0, n1), exponent(o0, o1, n0, n1)
    print(f"scaling {n0} -> {n1}: nltk time ~ n^{k_ref:.2f}, ours ~ n^{k_ours:.2f}")
    if n < len(docs):
        projected = r1 * (len(docs) / n) ** 2
        print(
            f"nltk on all {len(docs)} (projected, quadratic from n = {n}): ~{projected:.0f} CPU s, "
            f"~{projected / full_time:.0f}x ours; run with --n {len(docs)} to measure it"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=1000, help="synthetic generations (default 1000)")
    parser.add_argument("--tokens", type=int, default=64, help="words per synthetic generation (default 64)")
    parser.add_argument("--vocab", type=int, default=5000, help="synthetic vocabulary size (default 5000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--file", type=Path, help="read generations from this file, one per line, instead")
    parser.add_argument(
        "--n", type=int, default=400,
        help="generations for the NLTK side by side (default 400: NLTK on 1,000 takes ~3 min here)",
    )  # fmt: skip
    args = parser.parse_args(argv)

    if args.file:
        docs = [word_tokenize(line) for line in args.file.read_text(encoding="utf-8").splitlines()]
        source = f"{args.file} ({len(docs)} lines, word_tokenize)"
    else:
        docs = synthetic(args.generations, args.tokens, args.vocab, args.seed)
        source = f"synthetic: {len(docs)} x {args.tokens} words, vocabulary {args.vocab}, 1/r^1.1, seed {args.seed}"
    n = min(args.n, len(docs))
    if n < 4:
        parser.error("need at least 4 generations for the side by side")
    print(f"self-BLEU-4 benchmark  {source}")
    print(f"python {sys.version.split()[0]}")

    print("times: CPU seconds of this process (wall seconds in brackets)")
    half_value, half_time, half_wall = timed(self_bleu, docs[: len(docs) // 2], repeat=3)
    full_value, full_time, full_wall = timed(self_bleu, docs, repeat=3)
    for size, val, cpu, wall in [
        (len(docs) // 2, half_value, half_time, half_wall),
        (len(docs), full_value, full_time, full_wall),
    ]:
        print(f"ours on {size:5d}: self-BLEU-4 = {val:.12f} in {cpu:7.3f} s ({wall:7.3f} s), best of 3")
    k_full = exponent(half_time, full_time, len(docs) // 2, len(docs))
    print(f"ours scaling {len(docs) // 2} -> {len(docs)}: time ~ n^{k_full:.2f}")
    print(f"side by side with NLTK on the first {n // 2} and {n} generations:")

    side_by_side(docs, n, full_time)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
