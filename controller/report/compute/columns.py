"""The summary's columns, by kind: one home for the names every format and the reduce agree on."""

from __future__ import annotations

MAUVE_COLUMNS = ["mauve_n", "mauve_n_references", "mauve_clusters"]  # MAUVE's equal sample, where it applies
ID_COLUMNS = ["model", "strategy", "params", "n_prompts", "n_generations", "n_seeds"]
SPEED_COLUMNS = ["tokens_per_s", "latency_ms_p50", "latency_ms_p95", "ttft_ms_p50", "peak_memory_mb"]
QUALITY_COLUMNS = [
    "mean_length",
    "rep_2",
    "rep_3",
    "rep_4",
    "diversity",
    "distinct_1",
    "distinct_2",
    "distinct_3",
    "self_bleu_4",
    "zipf",
    "perplexity",
    "bleu",
    "rouge_1",
    "rouge_2",
    "rouge_l",
]
DESIGN_COLUMNS = ID_COLUMNS + SPEED_COLUMNS + QUALITY_COLUMNS
EXTRA_SPEED_COLUMNS = [
    "decode_ms_per_token",
    "joules_per_token",
    "joules_per_1k_tokens",
    "nvml_peak_mb",
    "nvml_mean_mb",
    "gpu_util_mean",
    "memory_kind",
    "n_jobs",
    "cell",
]
COUNT_COLUMNS = ["n_prompts", "n_generations", "n_seeds", "n_jobs", *MAUVE_COLUMNS]
KEY_COLUMNS = ["model", "strategy", "params"]
# a variant's samples and best_of (docs/sweeps.md#samples): columns only where a cell has samples
SAMPLES_COLUMNS = ["samples", "best_of"]
REFERENCE = "reference"
PAIRED_COLUMN = "paired_prompts"  # `report --compare`: the prompts a pair of cells was compared over (empty: not)
PROMPTS_ATTR = "prompts"  # `report --compare`'s frame.attrs: each sweep's prompts and how many they hold alike
