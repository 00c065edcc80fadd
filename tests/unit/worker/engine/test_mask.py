"""The prepared SDPA mask of the decode loop's steps (worker.engine.models.prepared_mask).

Decode steps give SDPA its boolean mask ready-made instead of letting transformers rebuild it
(and check it for padding, a host synchronisation on CUDA) at every step. Asserted: each row is
still its unbatched run on the families that take it; every listed family gives bit-identical
logits either way; the check runs when a job is configured, not inside a timed batch; a
forward that reads the mask otherwise, or a configuration where transformers would build
another mask, keeps transformers' own.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.engine import MIXED, job, small_config, unbatched_greedy
from worker.core.contract import ModelSpec
from worker.engine.job import generate_job
from worker.engine.models import MASK_PASSTHROUGH
from worker.engine.plan import configure

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt_neox"])
def test_decode_steps_pass_sdpa_a_prepared_mask_and_each_row_is_its_unbatched_run(
    family, tiny_model, runtime, tmp_path, monkeypatch
):
    """The ready 4D mask (no per-step rebuild, no host sync on CUDA) computes what generate() computes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.engine.call import ModelCall

    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(small_config(family)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
    masks = []
    real_forward = ModelCall.forward

    def forward(self, rows, cache):
        masks.append(self.mask)
        return real_forward(self, rows, cache)

    monkeypatch.setattr(ModelCall, "forward", forward)
    lm = runtime.cache.get(ModelSpec(path=str(tmp_path)), runtime.device)
    spec = job(str(tmp_path), "greedy", batch_size=3, max_new=12, stop=["e"], prompts=MIXED)
    result, records = generate_job(spec, runtime)
    assert masks and all(masks) and result.engine["refills"] >= 2
    assert result.engine["decode_mask"].startswith("prepared")
    assert result.batches[0].compactions >= 1  # rows ended apart: compaction and merges ran with the mask
    for prompt, rec in zip(MIXED, records):
        assert rec.token_ids == unbatched_greedy(lm, prompt, 12)[: rec.n_new_tokens], prompt


@pytest.mark.parametrize("family", sorted(MASK_PASSTHROUGH))
def test_every_listed_family_gives_identical_logits_with_the_prepared_mask(family):
    """The list of families is checked against the installed transformers: a padded decode step of a
    random-weight model of each gives bit-identical logits with either mask."""
    from transformers import AutoModelForCausalLM

    from worker.engine.models import prepared_mask

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(small_config(family)).eval()
    assert model.config._attn_implementation == "sdpa" and prepared_mask(model), family


def test_the_mask_check_runs_when_a_job_is_configured_not_inside_a_timed_batch(tiny_model, runtime):
    from worker.core.contract import GenerationSettings, StrategySpec
    from worker.engine import models

    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    models.probes(lm.model).prepared_mask = None  # not asked yet (the answer lives beside the model, not on it)
    configure(lm, StrategySpec(name="greedy"), GenerationSettings())
    assert models.probes(lm.model).prepared_mask is True


def test_a_forward_that_reads_the_prepared_mask_otherwise_keeps_transformers_mask():
    import functools

    from transformers import AutoModelForCausalLM

    from worker.engine.models import prepared_mask

    model = AutoModelForCausalLM.from_config(small_config("llama")).eval()
    real = model.forward

    @functools.wraps(real)
    def forward(*args, attention_mask=None, **kwargs):  # as a release whose forward used the mask for more
        out = real(*args, attention_mask=attention_mask, **kwargs)
        if attention_mask is not None and attention_mask.dim() == 4:
            out.logits = out.logits + 1e-3
        return out

    model.forward = forward
    assert not prepared_mask(model)


def test_the_prepared_mask_only_where_transformers_would_build_the_same_one(tiny_model, runtime):
    from transformers import AutoModelForCausalLM, MistralForCausalLM, OPTConfig

    from tests.support.engine import sliding_window_config
    from worker.engine.kvcache import preallocated_cache
    from worker.engine.models import prepared_mask

    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    assert prepared_mask(lm.model) and preallocated_cache(lm.model, 8) is not None  # gpt2, sdpa, plain layers
    sliding = MistralForCausalLM(sliding_window_config())
    assert preallocated_cache(sliding, 8) is None  # no preallocated cache: the loop keeps transformers' mask
    eager = AutoModelForCausalLM.from_config(small_config("llama"), attn_implementation="eager")
    assert not prepared_mask(eager)  # eager attention adds transformers' float mask
    opt_config = OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=64)
    assert not prepared_mask(AutoModelForCausalLM.from_config(opt_config))  # OPT reads positions from the 2D mask
