"""The execution plan of a job: every choice of how it runs, made once, here, before anything runs.

`configure(lm, strategy, settings, prompts, assistant)` turns a strategy variant on a loaded model,
with the job's prompts tokenised once (worker.engine.chat: a chat model's turns end at its end of
turn too), into a frozen `Plan`: the transformers GenerationConfig (with the engine's seeded
sampler taking over the sampling settings), the `Path` the batches take, the token chooser of the
decode loop, the KV-cache kind, the prepared mask, continuous refill, the warm-up, and the rules
every token choice obeys (worker.engine.choose.Rules), built once. The batch plan
(`worker.engine.batching`, `job.plan_batches`) is decided from the plan and kept beside it;
nothing downstream decides again, and worker.engine.record writes the plan into result.json.

A strategy declares its kind (`worker.strategies.Kind`); `STEPS` maps a kind to its token chooser
(worker.engine.choose, worker.engine.loops), which the decode loop (worker.engine.decode) runs over
the preallocated cache where the model's layers are plain (and the chooser does not repeat rows)
and over transformers' own cache elsewhere. Where the
loop cannot reproduce what generate() would do, transformers' generate() runs the batch
(`Path.GENERATE`): beam search on a model whose cache cannot be reordered or with settings the step
does not reproduce, assisted decoding, processors the engine does not rebuild, a static cache.
Contrastive and diverse beam search have no such fallback (transformers 5 no longer runs them): a
model whose cache the loop cannot reorder is refused, in one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Any

import torch
from transformers import GenerationConfig

from worker.core.contract import GenerationSettings, PromptItem, StrategySpec
from worker.core.errors import PermanentJobError
from worker.engine import chat
from worker.engine.call import ModelCall
from worker.engine.choose import Chooser, Rules, rules
from worker.engine.custom import step_class
from worker.engine.graphs import DecodeStep
from worker.engine.loops import beam, contrastive
from worker.engine.loops.beam_step import BeamStep
from worker.engine.models import LoadedModel, prepared_mask, probes
from worker.engine.modifiers import PROCESSORS, RowModifiers, only_modifiers
from worker.engine.sampling import SAMPLING_KEYS, SeededSampler
from worker.strategies import Kind, Strategy, get_strategy


class Path(str, Enum):
    """Which code runs a job's batches."""

    DECODE = "decode"  # the engine's decode loop driving a step (worker.engine.decode)
    GENERATE = "generate"  # transformers' generate()


class Cache(str, Enum):
    """The KV cache the batches decode over."""

    PREALLOCATED = "preallocated"  # worker.engine.kvcache: allocated once per batch or stream, written in place
    DYNAMIC = "dynamic"  # transformers' own (dynamic, or the kind the model's generation config names)
    STATIC = "static"  # transformers' static cache (compiled forward pass on CUDA)


# kind -> the token chooser of the decode loop that decodes it
STEPS: dict[Kind, type[Chooser]] = {
    Kind.TOKEN: Chooser,
    Kind.CONTRASTIVE: contrastive.ContrastiveStep,
    Kind.BEAM: BeamStep,
    Kind.DIVERSE_BEAM: BeamStep,
}
# kinds transformers 5 no longer runs, and a strategy's own step (Kind.CUSTOM: a plugin's, worker.engine.custom)
ONLY_THE_ENGINE = frozenset({Kind.CONTRASTIVE, Kind.DIVERSE_BEAM, Kind.CUSTOM})


NO_PROMPTS = chat.Prompts({})  # a plan without the job's prompts: each batch tokenises its own


@dataclass(frozen=True)
class BatchPlan:
    """The job's prompts in groups that each run at their own size, longest prompts first: (size, batches);
    the size the scorer's batches use (the first group's) and what result.json records about it."""

    groups: tuple[tuple[int, tuple[tuple[PromptItem, ...], ...]], ...]
    scorer_size: int
    record: Mapping[str, Any]


@dataclass(frozen=True)
class Plan:
    """How one job runs, decided once (`configure`); worker.engine.record writes it into result.json."""

    config: GenerationConfig  # what generate() would be given (sampling settings moved to `sampler`)
    kind: Kind
    step: type[Chooser] | None  # the decode loop's token chooser; None: transformers' generate() runs the job
    params: Mapping[str, Any]  # the chooser's parameters
    cache: Cache
    mask: bool  # decode steps (and contrastive search's candidates) pass SDPA a prepared 4D mask
    refill: bool  # a job of several batches runs as one stream of batch_size rows
    warmup: bool  # one untimed short batch per loaded model and `warm_key` before anything is timed
    sampler: Mapping[str, Any] | None  # the seeded sampler's warper settings (sampling strategies), else None
    stop: tuple[str, ...]
    rules: Rules  # what every token choice obeys (processors, warpers, stop strings, ends), built once
    assistant: LoadedModel | None = None  # assisted decoding's draft model
    notes: tuple[str, ...] = ()  # what the result's notes say about the set-up
    samples: int = 1  # generations per prompt (the decode loop prefills a prompt once for all of them)
    prompt_ids: Mapping[str, list[int]] = field(default_factory=dict, repr=False)  # the prompts, tokenised once
    decode_step: DecodeStep = DecodeStep.EAGER  # the model call's decode step (`decode_step_of`)
    decode_step_why: str = ""  # why that one, as result.json says

    @property
    def path(self) -> Path:
        """Which code runs the job's batches: the decode loop where the plan has a chooser."""
        return Path.DECODE if self.step is not None else Path.GENERATE

    @property
    def warm_key(self) -> tuple:
        """What a warm-up warms: the code a batch runs (the path, chooser, cache, mask, decode step, generate()'s
        cache and compile, the draft model), so that a job whose batches run other code than an earlier job's on
        the same model is warmed too (else generate()'s compile of a static cache on CUDA falls in its first timed
        batch)."""
        step = self.step.__name__ if self.step is not None else None
        draft = self.assistant.spec.label if self.assistant is not None else None
        code = (self.cache.value, self.mask, self.decode_step.value, self.config.cache_implementation)
        return (self.path.value, step, self.sampler is not None, *code, draft)

    @property
    def rows_each(self) -> int:
        """KV-cache rows a prompt occupies: its samples, its beams, or contrastive search's k candidates where
        they are rows of a repeated cache (without the prepared mask)."""
        return _rows_each(self.kind, self.mask, self.config, self.params) * self.samples

    def call(self, model, clock=None) -> ModelCall:
        """The decode loop's model call: the model with the plan's mask, cache and decode step, timed by `clock`."""
        preallocated = self.cache is Cache.PREALLOCATED
        return ModelCall.of(model, mask=self.mask, preallocated=preallocated, step=self.decode_step, clock=clock)

    def chooser(self, sampler: SeededSampler | None, prompts: int, device) -> Chooser:
        """The token chooser of a decode call of `prompts` prompts, an output row per generation (their samples)."""
        if self.step is None:
            raise ValueError(f"a plan on {self.path.value} has no chooser")
        ends = self.rules.ends
        tokens = torch.full((prompts * self.samples, ends.max_new + 1), ends.fill, dtype=torch.long, device=device)
        return self.step(self.rules, sampler, tokens, self.samples, **self.step.options(self.params))

    def shortened(self, max_new: int, min_new: int | None) -> Plan:
        """The plan of a short run of the same job (the warm-up, the CPU batch-size probe): other lengths only."""
        config = GenerationConfig(
            **{**self.config.to_dict(), "max_new_tokens": max_new, "min_new_tokens": min_new, "max_length": None}
        )
        ends = self.rules.ends._replace(max_new=max_new)
        short = self.rules._replace(processors=RowModifiers(config), ends=ends)
        return dataclasses.replace(self, config=config, rules=short)


# What a checkpoint's generation_config.json may set that no built-in strategy names: the processors the engine does
# not build (a BART-style min_length, Whisper-style suppress_tokens, forced ends, a sequence bias) and generate()'s
# own ends (max_time, stop_strings). Each takes transformers' default unless the strategy sets it: a variant runs
# what its label says, as on vLLM, which reads none of them (the warpers and penalties: registry.WARPERS_OFF).
CHECKPOINT_ONLY = (*PROCESSORS, "max_time", "stop_strings")


def generation_config(lm: LoadedModel, kwargs: dict[str, Any], settings: GenerationSettings) -> GenerationConfig:
    """The model's generation config with the strategy's settings, the lengths and its tokenizer's pad and EOS."""
    off = {key: value for key, value in _defaults().items() if key in CHECKPOINT_ONLY}
    cfg = GenerationConfig(**{**lm.model.generation_config.to_dict(), **off, **kwargs})
    # transformers 5 leaves these None where neither the checkpoint nor the strategy sets them (a plugin's to_config
    # may not); generate() reads them as greedy search, one beam: so does the plan
    cfg.num_beams = 1 if cfg.num_beams is None else cfg.num_beams
    cfg.do_sample = False if cfg.do_sample is None else cfg.do_sample
    cfg.max_new_tokens = settings.max_new_tokens
    cfg.min_new_tokens = settings.min_new_tokens or None
    cfg.max_length = None
    cfg.pad_token_id = lm.tokenizer.pad_token_id
    if cfg.eos_token_id is None:
        cfg.eos_token_id = lm.tokenizer.eos_token_id
    return cfg


def _settings_of(registered: Strategy, params: Mapping[str, Any]) -> dict[str, Any]:
    """The strategy's GenerationConfig settings; one that transformers does not have (a plugin's `to_config` with a
    misspelt key) is refused: GenerationConfig would keep it as an attribute nothing reads, and the job would run
    without it."""
    kwargs = registered.generation_kwargs(dict(params))
    unknown = sorted(set(kwargs) - _known_settings())
    if unknown:
        raise PermanentJobError(
            f"strategy {registered.name}: its to_config gives {unknown[0]!r}, which is not a setting of transformers' "
            "GenerationConfig (a misspelt key would be ignored)"
        )
    return kwargs


@cache
def _defaults() -> dict[str, Any]:
    return GenerationConfig().to_dict()


@cache
def _known_settings() -> frozenset[str]:
    return frozenset(_defaults())


def _take_sampling(cfg: GenerationConfig) -> dict[str, Any] | None:
    """The sampling settings, moved from generate()'s config to the engine's seeded sampler."""
    if not (cfg.do_sample and cfg.num_beams == 1):
        return None
    sampler = {k: getattr(cfg, k) for k in SAMPLING_KEYS}
    cfg.do_sample = False
    cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p, cfg.typical_p = 1.0, None, 1.0, None, 1.0
    cfg.epsilon_cutoff, cfg.eta_cutoff = 0.0, 0.0
    return sampler


def configure(
    lm: LoadedModel,
    strategy: StrategySpec,
    settings: GenerationSettings,
    prompts: chat.Prompts = NO_PROMPTS,
    assistant: LoadedModel | None = None,
) -> Plan:
    """The plan of a strategy variant on a loaded model for the job's `prompts` (tokenised once: the
    job's worker.engine.chat.encoded; none: each batch tokenises its own), with its draft model."""
    registered = get_strategy(strategy.name)
    kind, params = registered.kind, checked_params(lm, registered, strategy.params)
    if strategy.samples is not None and not registered.stochastic:  # a job the planner would never have made
        raise PermanentJobError(f"samples: strategy {strategy.name} is deterministic; samples is for stochastic ones")
    cfg = generation_config(lm, _settings_of(registered, strategy.params), settings)
    if prompts.chat:  # a turn ends at the template's end of turn as well as at EOS
        cfg.eos_token_id = chat.stop_ids(lm.tokenizer, cfg.eos_token_id)
    sampler = _take_sampling(cfg)
    if cfg.num_beams > 1 and settings.stop:  # assisted decoding: stops.NewTokens (its draft's generate() refuses them)
        cfg.stop_strings = list(settings.stop)
    notes = _static_cache(lm, kind, cfg) if settings.static_cache else []
    if kind is Kind.BEAM:
        params = beam.beam_params(cfg)
    if registered.plugin or kind is Kind.CUSTOM:  # a plugin's, whatever its kind: its distribution and version
        notes.append(f"strategy {registered.name}: plugin {registered.plugin or registered.step}")
    if kind is Kind.CUSTOM:  # the strategy's own step, always on the decode loop
        path, step = Path.DECODE, _custom_step(registered, cfg)
    else:
        path, step = _path(lm, kind, cfg, strategy.name)
    samples = strategy.n_samples
    if samples > 1 and path is Path.GENERATE:
        notes.append(f"samples: transformers' generate() runs this job, which prefills each prompt {samples} times")
    mask = path is Path.DECODE and prepared_mask(lm.model)  # its once-per-model check, outside any timed batch
    # contrastive search's candidates repeat their row where the prepared mask is refused: transformers' cache
    preallocated = path is Path.DECODE and probes(lm.model).preallocated and (kind is not Kind.CONTRASTIVE or mask)
    static = cfg.cache_implementation == "static"
    cache = Cache.PREALLOCATED if preallocated else Cache.STATIC if static else Cache.DYNAMIC
    decode_step, why = decode_step_of(settings.decode_step, lm.device, step, cache, mask)
    return Plan(
        config=cfg,
        kind=kind,
        step=step,
        params=params,
        cache=cache,
        mask=mask,
        refill=preallocated and settings.refill,  # refill writes newcomers into the preallocated buffers
        warmup=settings.warmup,
        sampler=sampler,
        stop=tuple(settings.stop),
        rules=rules(cfg, sampler, tuple(settings.stop), lm.tokenizer, lm.device),
        assistant=assistant,
        notes=tuple(notes),
        samples=samples,
        prompt_ids=prompts.ids,
        decode_step=decode_step,
        decode_step_why=why,
    )


def _static_cache(lm: LoadedModel, kind: Kind, cfg: GenerationConfig) -> list[str]:
    """`static_cache: true`: transformers' static cache set in `cfg` where the model and the strategy take it
    (generate() compiles the forward pass on CUDA for it), else the note saying the dynamic cache is used."""
    if getattr(lm.model, "_can_compile_fullgraph", False) and kind not in ONLY_THE_ENGINE:
        cfg.cache_implementation = "static"
        return []
    return ["static_cache: not supported for this model or strategy; dynamic cache used"]


def checked_params(lm: LoadedModel, registered: Strategy, params: Mapping[str, Any]) -> dict[str, Any]:
    """The job's parameters, checked by this worker's strategy, and those the model's vocabulary bounds. The sweep
    was checked where it was submitted: a refusal of the strategy's own is another version of it (a plugin's, or
    decodebench's) than the submitter's, which no retry mends. Contrastive search's k candidates are k of the
    model's tokens (more failed mid-batch in `topk`, "selected index k out of range")."""
    try:
        checked = registered.validate(dict(params))
    except ValueError as err:
        whose = f"from plugin {registered.plugin}" if registered.plugin else "a built-in"
        raise PermanentJobError(
            f"strategy {registered.name}: {err} (this worker's strategy, {whose}, differs from the one the sweep "
            "was checked with: install the same version on both)"
        ) from None
    vocab = lm.model.config.get_text_config().vocab_size
    if registered.kind is Kind.CONTRASTIVE and vocab and checked["k"] > vocab:
        raise PermanentJobError(
            f"{registered.name}: k ({checked['k']}) is more candidates than the model has tokens ({vocab})"
        )
    return checked


# `decode_step: auto` takes CUDA graphs on CUDA once a device run has checked the capture on a real GPU
# (issue 44: tests/gpu/test_gpu.py and benchmarks/bench_graphs.py through scripts/device-checks.sh); until then
# they are opt-in, and every GPU result keeps the eager step it had
GRAPHS_BY_DEFAULT = False


def decode_step_of(
    setting: str, device: torch.device, step: type[Chooser] | None, cache: Cache, mask: bool
) -> tuple[DecodeStep, str]:
    """The decode step a plan takes for the sweep's `decode_step` setting, and why (result.json says it): the
    static step (worker.engine.graphs) only where the loop's pass is the model call's (one token a row, or
    contrastive search's candidates) over the preallocated cache with the prepared mask; CUDA graphs only on
    CUDA; `auto` takes them there (once GRAPHS_BY_DEFAULT) and the eager step on the CPU, where a step's
    kernels cost no launch overhead and attending over the window only is the cheaper."""
    if setting == "eager":
        return DecodeStep.EAGER, "decode_step: eager"
    if step is None:
        return DecodeStep.EAGER, "transformers' generate() runs this job"
    if cache is not Cache.PREALLOCATED or not mask:
        return DecodeStep.EAGER, "the static step needs the preallocated cache and the prepared mask"
    if step.forward_of is not Chooser.forward_of and not step.own_pass_through_call:
        return DecodeStep.EAGER, f"{step.__name__} runs a decode pass of its own"
    cuda = device.type == "cuda"
    if setting == "auto":
        if cuda and GRAPHS_BY_DEFAULT:
            return DecodeStep.GRAPHS, "CUDA graphs, one per bucket of rows"
        if cuda:
            return (
                DecodeStep.EAGER,
                "auto: CUDA graphs are opt-in (decode_step: graphs) until a GPU run has checked them",
            )
        return DecodeStep.EAGER, "on the CPU the eager step (no launches to save; the window only)"
    if setting == "graphs":
        if cuda:
            return DecodeStep.GRAPHS, "decode_step: graphs"
        return DecodeStep.STATIC, "decode_step: graphs, and no CUDA here: the static step runs eagerly"
    return DecodeStep.STATIC, "decode_step: static"


def _path(lm: LoadedModel, kind: Kind, cfg: GenerationConfig, name: str) -> tuple[Path, type[Chooser] | None]:
    """The path of the job's batches and, on the decode loop, its step; a kind only the engine runs, on a
    model whose cache its step cannot drive, is refused in one line."""
    step = decode_step(lm, kind, cfg)
    if step is not None:
        return Path.DECODE, step
    if kind in ONLY_THE_ENGINE:
        raise PermanentJobError(
            f"{name}: this model's KV cache is not plain attention layers, which decodebench's own loop"
            " reorders row by row, and transformers 5 no longer runs this strategy"
        )
    return Path.GENERATE, None


def _custom_step(registered: Strategy, cfg: GenerationConfig) -> type[Chooser]:
    """A Kind.CUSTOM strategy's step, where the decode loop applies all the model's generation config asks."""
    if not only_modifiers(cfg):
        raise PermanentJobError(
            f"strategy {registered.name} runs on the decode loop only, which does not apply this model's "
            "generation config (processors beyond the repetition penalty, no-repeat n-grams, minimum length)"
        )
    return step_class(registered)


def decode_step(lm: LoadedModel, kind: Kind, cfg: GenerationConfig) -> type[Chooser] | None:
    """The decode loop's step for the kind where the loop reproduces generate() (or, for the kinds only
    the engine runs, the method): processors the loop rebuilds only; greedy search and sampling over the
    dynamic cache; beam search where its step reproduces generate()'s and the model's cache can be
    reordered; contrastive and diverse beam search where the model's cache is plain attention layers."""
    if kind is Kind.TOKEN:
        plain = cfg.num_beams == 1 and not cfg.do_sample and cfg.cache_implementation in (None, "dynamic")
        return STEPS[kind] if plain and only_modifiers(cfg) else None
    found = probes(lm.model)
    if kind is Kind.BEAM:
        return STEPS[kind] if beam.supports(cfg) and found.reorderable else None
    if kind in ONLY_THE_ENGINE and kind in STEPS and (found.preallocated or found.reorderable):
        return STEPS[kind]
    return None


def _rows_each(kind: Kind, mask: bool, cfg: GenerationConfig, params: Mapping[str, Any]) -> int:
    """KV-cache rows one prompt occupies: its beams, or contrastive search's k candidates where they are
    rows of a repeated cache (without the prepared mask); one elsewhere."""
    if kind is Kind.CONTRASTIVE:
        return 1 if mask else int(params["k"])
    return max(int(cfg.num_beams or 1), int(params.get("num_beams", 1)))
