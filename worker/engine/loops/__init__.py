"""The steps of the engine's decode loop that are not greedy search's or sampling's.

`contrastive.ContrastiveStep` and `beam_step.BeamStep` are steps of the decode loop
(worker.engine.decode: compaction, and continuous refill over the preallocated cache, come with
it); `beam.supports` says which beam-search settings the step reproduces. The plan picks the
step, once (worker.engine.plan: `STEPS`).
"""
