"""The engine: the only part of decodebench that imports torch and transformers.

`job.run_job` runs one job (models, batches, generation, timing, sampling, scoring,
telemetry) and writes it to the store; local mode and the RQ task both call it.
"""
