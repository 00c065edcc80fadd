"""The vLLM engine (docs/engines.md): the same job interface as the own engine, run by vLLM's offline `LLM`.

`run.generate_job(job, runtime)` returns what `worker.engine.job.generate_job` returns (a
`JobResult` and its `GenerationRecord`s); `params` maps a strategy variant onto `SamplingParams`,
`llm` builds and caches one `vllm.LLM` per model and engine settings. Only these modules import vllm.
"""
