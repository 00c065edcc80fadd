"""A second generative process for the interval benchmarks (`bench_coverage.py --process markov`).

bench_coverage's own process draws words i.i.d. from a Zipf law with a per-prompt chance of copying an
earlier bigram; intervals tuned on it alone could be tuned to it (issue 46). This one differs in every
mechanism the report's statistics are sensitive to:

- words follow a sparse first-order Markov chain over the same Zipf vocabulary (each word has 4 favoured
  successors; a step takes one of them with probability 0.6, else a Zipf draw): bigrams repeat by the chain;
- degenerate loops: each prompt has an onset hazard h ~ Beta(0.4, 30) per token; once it fires, the
  generation repeats a cycle of its last L words (L uniform in 2..6) to the end, as looping models do;
- length and end of sequence coupled: each prompt has a stop hazard s ~ Beta(1.2, 30) per token, a
  generation ends at EOS when it fires and at MAX_NEW tokens otherwise ("length"); a looping generation
  never stops (loops crowd out EOS), so repetition, length and eos_rate move together across prompts;
- references: each prompt's reference is a walk of the same chain (lognormal length); a generation copies
  it in runs (at each position, with the prompt's copy propensity c ~ Beta(1.2, 2.5), it copies the next
  geometric(0.35) reference words from where it stands), so BLEU's 4-gram matches come in bursts.

One cell carries the texts, words, references and stop reasons of `seeds` generations per prompt.
"""

from __future__ import annotations

import numpy as np

from controller.metrics import CellData

VOCAB = 3000
ZIPF = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
ZIPF /= ZIPF.sum()
SUCCESSORS = np.random.default_rng(46).choice(VOCAB, size=(VOCAB, 4), p=ZIPF)  # fixed: the chain is the language
MAX_NEW = 64


def _walk(rng: np.random.Generator, n: int, start: int) -> list[int]:
    words, w = [], start
    zipf = rng.choice(VOCAB, size=n, p=ZIPF)
    favoured, which = rng.random(n) < 0.6, rng.integers(0, 4, n)
    for i in range(n):
        w = int(SUCCESSORS[w, which[i]]) if favoured[i] else int(zipf[i])
        words.append(w)
    return words


def _generation(rng: np.random.Generator, p: dict) -> tuple[list[int], str]:
    ref, out, k = p["reference"], [], 0
    chain = _walk(rng, MAX_NEW, int(rng.choice(VOCAB, p=ZIPF)))
    while len(out) < MAX_NEW:
        if len(out) >= 6 and rng.random() < p["loop"]:  # the loop: a cycle of the last L words to the end
            cycle = out[-int(rng.integers(2, 7)) :]
            while len(out) < MAX_NEW:
                out.extend(cycle[: MAX_NEW - len(out)])
            return out, "length"
        if k < len(ref) and rng.random() < p["copy"]:  # a run copied from the reference
            run = int(rng.geometric(0.35))
            out.extend(ref[k : k + run])
            k += run
        else:
            out.append(chain[len(out) % MAX_NEW])
            k += 1
        if rng.random() < p["stop"]:
            return out[:MAX_NEW], "eos"
    return out[:MAX_NEW], "length"


def simulate_cell(G: int, rng: np.random.Generator, seeds: int) -> tuple[CellData, list[str]]:
    """A cell of G prompts x `seeds` generations (texts, words, references, stop reasons) and each
    generation's prompt key."""
    cell, _, keys = _cells(G, rng, seeds, 1)
    return cell, keys


def simulate_pair(G: int, rng: np.random.Generator, seeds: int) -> tuple[CellData, CellData, list[str]]:
    """Two cells under the null (`bench_paired.py --process markov`): the same G prompts, each generation of
    either cell an independent draw of its prompt's process, so a prompt's pair is exchangeable."""
    return _cells(G, rng, seeds, 2)


def _prompt(rng: np.random.Generator) -> dict:
    length = int(np.clip(rng.lognormal(3.3, 0.4), 8, 80))
    return {
        "reference": _walk(rng, length, int(rng.choice(VOCAB, p=ZIPF))),
        "loop": rng.beta(0.4, 30.0),
        "stop": rng.beta(1.2, 30.0),
        "copy": rng.beta(1.2, 2.5),
    }


def _cells(G: int, rng: np.random.Generator, seeds: int, n_cells: int):
    """n_cells cells (a second one None where n_cells is 1) of the same G prompts, and the generations' keys;
    a prompt's generations drawn seed after seed, cell after cell."""
    out = [{"texts": [], "references": [], "stop_reasons": []} for _ in range(n_cells)]
    keys = []
    for g in range(G):
        p = _prompt(rng)
        ref_text = " ".join(f"w{w}" for w in p["reference"])
        for _ in range(seeds):
            for cell in out:
                words, reason = _generation(rng, p)
                cell["texts"].append(" ".join(f"w{w}" for w in words))
                cell["references"].append(ref_text)
                cell["stop_reasons"].append(reason)
            keys.append(f"p{g}")
    cells = [CellData(words=[t.split() for t in c["texts"]], **c) for c in out]
    return cells[0], cells[1] if n_cells == 2 else None, keys
