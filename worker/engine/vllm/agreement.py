"""Do the engines agree? The distribution check of docs/engines.md.

Sampled texts differ between engines (each draws its random numbers its own way), so the check is
on distributions: `exact_next_token_probs` is the strategy's next-token distribution computed
from the model's logits in float64 by its definition (temperature, then top-k / top-p / min-p /
typical / epsilon / eta),
`g_test` compares an engine's sampled counts against it (the G statistic, likelihood-ratio χ²,
with cells of expected count below 5 pooled) and gives the p-value. `second_token_probs` is the exact
joint distribution of the first two tokens (each first token's continuation filtered by the same
definition), and `g_test_pairs` the same test over pairs. A correct engine gives
p-values spread uniformly on [0, 1]; a wrong filter gives p ≈ 0 for enough samples.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GTest:
    g: float
    dof: int
    p_value: float
    n: int
    outside_support: int  # samples of tokens the exact distribution gives probability 0


def filtered_probs(logits: torch.Tensor, strategy: str, params: dict) -> torch.Tensor:
    """The strategy's next-token distribution from one row of logits, in float64, by its definition."""
    logits = logits.double()
    if strategy == "greedy":
        out = torch.zeros_like(logits)
        out[int(logits.argmax())] = 1.0
        return out
    probs = torch.softmax(logits / params.get("temperature", 1.0), dim=-1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if strategy == "top_k":
        keep[:] = False
        keep[torch.topk(probs, min(params["k"], probs.numel())).indices] = True
    elif strategy == "top_p":  # the smallest set of most likely tokens with mass >= p
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, 0) - sorted_p
        keep[:] = False
        keep[order[before < params["p"]]] = True
    elif strategy == "min_p":
        keep = probs >= params["p"] * probs.max()
    elif strategy in ("typical", "epsilon", "eta"):
        keep = _truncation_keep(probs, strategy, params)
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum()


def _truncation_keep(probs: torch.Tensor, strategy: str, params: dict) -> torch.Tensor:
    """The tokens typical, epsilon and eta sampling keep (Meister et al. 2023; Hewitt et al. 2022), with
    transformers' conventions: the most likely token always stays, and typical sampling keeps the tokens
    closest to the entropy until their mass reaches `mass`, the one that reaches it (and its ties) included."""
    entropy = -(probs * torch.log(probs)).nansum()
    if strategy == "typical":
        surprise = torch.abs(-torch.log(probs) - entropy)
        order = torch.argsort(surprise, stable=True)
        reached = int((torch.cumsum(probs[order], 0) < params["mass"]).sum())
        return surprise <= surprise[order[min(reached, probs.numel() - 1)]]
    cutoff = (
        params["epsilon"]
        if strategy == "epsilon"
        else min(params["eta"], math.sqrt(params["eta"]) * math.exp(-entropy))
    )
    return (probs >= cutoff) | (probs == probs.max())


def g_test(samples: list[int], probs: torch.Tensor, min_expected: float = 5.0) -> GTest:
    """G-test of `samples` (token ids) against `probs`; tokens of small expected count pooled into one cell."""
    n = len(samples)
    counts = Counter(samples)
    outside = sum(c for t, c in counts.items() if probs[t] <= 0)
    big = torch.nonzero((probs > 0) & (probs * n >= min_expected)).flatten().tolist()  # vectorised: a
    cells = [(counts.get(t, 0), float(probs[t]) * n) for t in big]  # pair test's support has millions
    rest_obs = n - outside - sum(o for o, _ in cells)
    rest_exp = n - sum(e for _, e in cells)
    if rest_exp > 1e-9:
        cells.append((rest_obs, rest_exp))
    g = 2.0 * sum(o * math.log(o / e) for o, e in cells if o > 0)
    dof = max(len(cells) - 1, 1)
    from scipy.stats import chi2

    p_value = 0.0 if outside else float(chi2.sf(g, dof))
    return GTest(round(g, 4), dof, p_value, n, outside)


def next_token_logits(model, tokenizer, prompt: str) -> torch.Tensor:
    """The model's logits for the token after `prompt` (float32 forward pass, no cache)."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1]


def second_token_probs(model, tokenizer, prompt: str, strategy: str, params: dict) -> dict[tuple[int, int], float]:
    """The exact joint distribution of the first two tokens, P(t1) x P(t2 | t1), over every first token the
    strategy can draw: one batched forward pass of the prompt followed by each of them (float64 filters)."""
    first = filtered_probs(next_token_logits(model, tokenizer, prompt), strategy, params)
    support = torch.nonzero(first > 0).flatten()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    batch = torch.cat([ids.repeat(len(support), 1), support[:, None]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=batch).logits[:, -1]
    joint: dict[tuple[int, int], float] = {}
    for t1, row in zip(support.tolist(), logits, strict=True):
        second = filtered_probs(row, strategy, params)
        kept = torch.nonzero(second > 0).flatten()
        joint.update(zip([(t1, t2) for t2 in kept.tolist()], (first[t1] * second[kept]).tolist(), strict=True))
    return joint


def g_test_pairs(samples: list[tuple[int, int]], joint: dict[tuple[int, int], float]) -> GTest:
    """`g_test` over pairs of tokens: each pair of the support one cell (a pair outside it: outside support)."""
    index = {pair: i for i, pair in enumerate(joint)}
    probs = torch.tensor([*joint.values(), 0.0], dtype=torch.float64)
    return g_test([index.get(pair, len(joint)) for pair in samples], probs)


def first_token_check(model_path: str, prompt: str, strategy: str, params: dict, samples: int = 2000) -> GTest:
    """vLLM's first tokens (one seed per draw) against the exact distribution from transformers' logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.core.contract import GenerationSettings, ModelSpec, StrategySpec
    from worker.core.engines import VllmEngine
    from worker.engine.vllm.llm import LLMCache
    from worker.engine.vllm.params import sampling_params, sampling_settings
    from worker.strategies import get_strategy

    params = get_strategy(strategy).validate(params)
    settings = sampling_settings(StrategySpec(name=strategy, params=params), GenerationSettings(max_new_tokens=1))
    filters = strategy in ("typical", "epsilon", "eta")  # the LLM with decodebench's logits processor
    loaded = LLMCache().get(ModelSpec(path=model_path), VllmEngine(name="vllm", dtype="float32"), "cpu", filters)
    outs = loaded.llm.generate(
        [prompt] * samples, [sampling_params(settings, s) for s in range(samples)], use_tqdm=False
    )
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    exact = filtered_probs(next_token_logits(model, tok, prompt), strategy, params)
    return g_test([o.outputs[0].token_ids[0] for o in outs], exact)


def main() -> None:
    """`python -m worker.engine.vllm.agreement MODEL PROMPT STRATEGY [key=value ...]` (in .venv-vllm)."""
    import sys

    model, prompt, strategy, *pairs = sys.argv[1:]
    params = {k: float(v) if "." in v else int(v) for k, v in (p.split("=", 1) for p in pairs)}
    r = first_token_check(model, prompt, strategy, params)
    print(f"{strategy} {params}: G={r.g} dof={r.dof} p={r.p_value:.4f} over {r.n} first tokens")


if __name__ == "__main__":
    main()
