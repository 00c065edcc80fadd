"""Decoding loops of the strategies that transformers 5 no longer runs in its core, and their steps in
the engine's own loop.

A strategy names its loop as "module:function" (`Strategy.loop`); the engine imports it. Where a
strategy's step fits the own loop (worker.engine.decode), the engine runs that instead
(`contrastive.Step`, `beam_step.BeamStep`): compaction and continuous refill come with it.
"""
