"""The steps of the engine's decode loop that are not greedy search's or sampling's, and the batch
searches that serve where a step does not fit.

`contrastive.ContrastiveStep` and `beam_step.BeamStep` are steps of the decode loop
(worker.engine.decode: compaction and continuous refill come with it); `contrastive.generate`
(candidates over a repeated cache) and `beam.generate` (beams over transformers' own cache) are
the strategies' batch searches. The plan picks one, once (worker.engine.plan: `STEPS`, `SEARCHES`).
"""
