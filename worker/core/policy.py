"""Per-job policy: what one job may load and what it may cost, checked by the submission server
at submit, by `decodebench validate`, and by the worker again before it runs a job.

- `job_models(job)`: every model a job loads, by role (model, scorer, featurizer, assistant);
- `Limits`: the caps on the parameters that multiply a job's cost (beams, contrastive
  candidates, beam groups, draft tokens, samples per prompt), built at the edge from settings;
- `job_refusal(job, tenant, limits)`: one line saying why the job may not run (a model the tenant may
  not use, a strategy its engine cannot run exactly, a cost over the limits), or None;
- `model_positions(config)` and `context_refusal(...)`: a model's context length and the check
  the engine makes before it allocates anything (longest prompt + max_new_tokens must fit).

Light: reads the job's strategy parameters by name, imports no strategy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.core import settings
from worker.core.contract import JobSpec, ModelSpec
from worker.core.engines import engine_refusal
from worker.core.errors import short

ASSISTANT_PARAM = "assistant"  # the assisted strategy's draft model (worker/strategies/assisted.py)
# (strategy, parameter) -> the Limits field that caps it
COST_PARAMS: dict[tuple[str, str], str] = {
    ("beam", "num_beams"): "max_num_beams",
    ("diverse_beam", "num_beams"): "max_num_beams",
    ("diverse_beam", "num_beam_groups"): "max_beam_groups",
    ("contrastive", "k"): "max_candidates",
    ("assisted", "num_assistant_tokens"): "max_assistant_tokens",
}
# where a transformers config keeps its context length, first found wins
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class Limits:
    """Caps on the per-job parameters that multiply its cost (docs/settings.md)."""

    max_num_beams: int = 64
    max_candidates: int = 64
    max_beam_groups: int = 16
    max_assistant_tokens: int = 64
    max_samples: int = 64

    @classmethod
    def from_settings(cls) -> Limits:
        """DECODEBENCH_MAX_NUM_BEAMS, _MAX_CANDIDATES, _MAX_BEAM_GROUPS, _MAX_ASSISTANT_TOKENS, _MAX_SAMPLES or
        their defaults."""
        return cls(**{name: settings.get(name) for name in cls.__dataclass_fields__})


def job_models(job: JobSpec) -> list[tuple[str, ModelSpec]]:
    """(role, model) of every model the job loads: model, scorer, featurizer, assistant."""
    out = [("model", job.model)]
    out += [(role, spec) for role in ("scorer", "featurizer") if (spec := getattr(job, role)) is not None]
    assistant = job.strategy.params.get(ASSISTANT_PARAM)
    if job.strategy.name == "assisted" and assistant is not None:
        if not isinstance(assistant, str):
            assistant = repr(assistant)
        out.append(("assistant", ModelSpec(path=assistant or "?")))
    return out


def _model_refusal(role: str, spec: ModelSpec, tenant) -> str | None:
    if tenant is None:
        return None
    if not tenant.allows_model(spec.path, spec.revision):
        label = spec.path if spec.revision is None else f"{spec.path}@{spec.revision}"
        return f"refused: {role} {short(label, 160)} is not among tenant {tenant.name}'s models"
    if spec.trust_remote_code and not tenant.trust_remote_code:
        return f"refused: {role} {short(spec.path)} asks for trust_remote_code, which tenant {tenant.name} may not use"
    return None


def _cost_refusal(name: str, params: dict[str, Any], limits: Limits, samples: int | None = None) -> str | None:
    if samples is not None and samples > limits.max_samples:
        return f"refused: {name} samples={samples} is over the limit of {limits.max_samples} (DECODEBENCH_MAX_SAMPLES)"
    for (strategy, param), cap in COST_PARAMS.items():
        if strategy != name or param not in params:
            continue
        value, limit = params[param], getattr(limits, cap)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value > limit:
            return f"refused: {name} {param}={short(value)} is over the limit of {limit} (DECODEBENCH_{cap.upper()})"
    return None


def job_refusal(job: JobSpec, tenant, limits: Limits) -> str | None:
    """Why `job` may not run, in one line, or None.

    `tenant` is the tenant's entry of the tenants file (`worker.core.tenants.Tenant`: its
    `models` and `trust_remote_code`), or None where there is no tenants file: then only the
    cost limits apply (and trust_remote_code stays the job's own choice, as without tenants)."""
    for role, spec in job_models(job):
        why = _model_refusal(role, spec, tenant)
        if why:
            return why
    why = engine_refusal(job.engine, job.strategy.name, job.strategy.params, job.generation, job.strategy.best_of)
    return why or _cost_refusal(job.strategy.name, job.strategy.params, limits, job.strategy.samples)


def model_positions(config: dict) -> int | None:
    """A model's context length (tokens) from its config dict, None if it names none."""
    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        for key in POSITION_KEYS:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def context_refusal(positions: int | None, prompt_tokens: int, max_new_tokens: int, label: str) -> str | None:
    """One line if the longest prompt plus max_new_tokens does not fit the model's positions."""
    if positions is None or prompt_tokens + max_new_tokens <= positions:
        return None
    return (
        f"model {short(label)} takes {positions} positions: the longest prompt ({prompt_tokens} tokens) plus "
        f"max_new_tokens ({max_new_tokens}) is {prompt_tokens + max_new_tokens}; shorten one of them"
    )
