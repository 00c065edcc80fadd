"""Typical, epsilon and eta sampling on vLLM: a logits processor that reproduces transformers' warpers.

vLLM's `SamplingParams` has no typical_p, epsilon_cutoff or eta_cutoff. `processor_class()`, given to
`vllm.LLM(logits_processors=[...])` (worker.engine.vllm.llm), filters the rows of the requests whose
`SamplingParams.extra_args` name a filter (`FILTER_KEY`: {"kind": ..., "value": ...}) with transformers'
own arithmetic (`TypicalLogitsWarper`, `EpsilonLogitsWarper`, `EtaLogitsWarper`, `min_tokens_to_keep=1`
as generate() gives a sampled, single-beam request). It declares itself argmax invariant, so vLLM
applies it where it applies min-p: after penalties and temperature, on the sampled rows, before its
top-k/top-p, which is transformers' order (temperature, then the warper). Only sampled requests carry
a filter, and only their cells' LLM is given the processor (worker.engine.vllm.llm), with vLLM's V1
model runner, whose interface it implements (Model Runner V2, vLLM's default on a GPU, takes another);
every other cell runs plain vLLM. The distribution test of tests/vllm/test_vllm_engine.py holds vLLM's first tokens to
the definitions (`worker.engine.vllm.agreement.filtered_probs`).

The filters themselves (`truncate`) are plain torch functions, tested without vLLM.
"""

from __future__ import annotations

import functools
import math

import torch

FILTER_KEY = "decodebench_filter"
KINDS = {"typical": "mass", "epsilon": "epsilon", "eta": "eta"}  # strategy -> its parameter
PATH = "worker.engine.vllm.logitsprocs.TruncationLogitsProcessor"  # how engine.llm records it


def typical(scores: torch.Tensor, mass: float) -> torch.Tensor:
    """transformers' TypicalLogitsWarper on one row of (temperature-scaled) logits."""
    normalized = torch.nn.functional.log_softmax(scores, dim=-1)
    p = torch.exp(normalized)
    ent = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs((-normalized) - ent)
    sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
    cumulative = scores.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass).sum(dim=-1, keepdim=True).clamp_(max=sorted_scores.shape[-1] - 1)
    remove_sorted = sorted_scores > sorted_scores.gather(-1, last)
    remove_sorted[..., :1] = False
    return scores.masked_fill(remove_sorted.scatter(-1, sorted_indices, remove_sorted), -math.inf)


def _keep_top(scores: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    remove = remove & (scores < torch.topk(scores, 1)[0][..., -1, None])  # the top token always stays
    return scores.masked_fill(remove, -math.inf)


def epsilon(scores: torch.Tensor, cutoff: float) -> torch.Tensor:
    """transformers' EpsilonLogitsWarper: tokens of probability below `cutoff` go."""
    return _keep_top(scores, scores.softmax(dim=-1) < cutoff)


def eta(scores: torch.Tensor, cutoff: float) -> torch.Tensor:
    """transformers' EtaLogitsWarper: the cutoff is min(eta, sqrt(eta) * exp(-entropy))."""
    entropy = torch.distributions.Categorical(logits=scores).entropy()
    value = torch.tensor(cutoff, dtype=scores.dtype, device=scores.device)
    threshold = torch.min(value, torch.sqrt(value) * torch.exp(-entropy))[..., None]
    return _keep_top(scores, scores.softmax(dim=-1) < threshold)


FILTERS = {"typical": typical, "epsilon": epsilon, "eta": eta}


def truncate(scores: torch.Tensor, kind: str, value: float) -> torch.Tensor:
    return FILTERS[kind](scores, value)


def filter_of(params) -> tuple[str, float] | None:
    """The (kind, value) a request's SamplingParams carry, None for a request without one."""
    spec = (params.extra_args or {}).get(FILTER_KEY) if params is not None else None
    if not spec or params.temperature == 0.0:
        return None
    return spec["kind"], float(spec["value"])


@functools.cache
def processor_class():
    """vLLM's LogitsProcessor subclass, built on first use: this module imports without vLLM (the
    filters are tested without it)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class TruncationLogitsProcessor(LogitsProcessor):
        def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
            self.rows: dict[int, tuple[str, float]] = {}  # batch row -> its request's filter

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            spec = (sampling_params.extra_args or {}).get(FILTER_KEY)
            if spec is not None and (spec.get("kind") not in FILTERS or not 0 < float(spec.get("value", 0)) <= 1):
                raise ValueError(f"{FILTER_KEY}: kind one of {', '.join(FILTERS)}, value in (0, 1]")

        def is_argmax_invariant(self) -> bool:
            return True  # applied after temperature, to sampled rows only (the module's docstring)

        def update_state(self, batch_update) -> None:
            process_dict_updates(self.rows, batch_update, lambda params, _prompt, _out: filter_of(params))

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for row, (kind, value) in self.rows.items():
                logits[row] = truncate(logits[row], kind, value)
            return logits

    TruncationLogitsProcessor.__module__ = __name__
    return TruncationLogitsProcessor
