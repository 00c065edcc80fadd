"""What of beam search the engine's own loop reproduces, and the parameters of its step.

The `beam` strategy runs as beam search's step of the decode loop (`beam_step.BeamStep`) where
that step reproduces generate()'s beam search (`supports`: early_stopping True or False, one
sequence returned, no processor beyond the penalties and the minimum length, transformers'
dynamic cache) and the model's cache can be repeated, reordered and selected
(`kvcache.reorderable`: plain full or sliding-window attention layers); elsewhere generate()
runs it. `beam_params` gives the step its parameters: one group, no diversity penalty.
The plan asks both, once (worker.engine.plan).
"""

from __future__ import annotations

from worker.engine.modifiers import only_modifiers


def supports(config) -> bool:
    """Whether the engine's beam step reproduces generate()'s beam search for the configuration."""
    if config.num_beams <= 1 or config.do_sample or (config.num_return_sequences or 1) != 1:
        return False
    if config.early_stopping not in (True, False):  # "never" estimates the best length otherwise
        return False
    if getattr(config, "cache_implementation", None) not in (None, "dynamic"):
        return False
    return only_modifiers(config)


def beam_params(config) -> dict:
    """The step's parameters for plain beam search: one group, no diversity penalty."""
    return {
        "num_beams": config.num_beams,
        "num_beam_groups": 1,
        "diversity_penalty": 0.0,
        "length_penalty": config.length_penalty,
        "early_stopping": config.early_stopping,
    }
