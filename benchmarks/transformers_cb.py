"""transformers' own continuous batching as a side of bench_throughput.py: `vs_transformers_cb`.

`model.generate_batch` (transformers' continuous batching: a paged KV cache, a scheduler
that admits requests as others finish, CUDA graphs where it can) is the strongest
hand-written baseline the library decodebench builds on offers. Both sides get the mixed
prompts, greedy search, the same max_new_tokens and the same number of requests decoding at
once (decodebench's batch size is the manager's `max_requests_per_batch`), and the outputs
are checked identical. No stop string: transformers' manager takes no stop strings, so both
run to EOS or max_new_tokens. Both use SDPA (`auto_switch_to_flash` off: no flash-attention
package is assumed). The paged cache has an explicit size (enough pages for that many
requests of the longest prompt and max_new_tokens), so that on a GPU it does not take 90% of
the free memory while decodebench's side runs in the same rounds; the manager is built and
warmed once, untimed, reused by every round, and destroyed after.
"""

from __future__ import annotations

import logging
import math

from benchmarks.jobs import job
from benchmarks.sides import against, mixed_prompts, ours, rounds, strip

PAGE = 32  # tokens per page of the paged cache (the prompts and generations here are short)


def hand_cb(lm, prompts, requests: int, max_new: int):
    """A run of `generate_batch` over the prompts: (new tokens, token ids per prompt in order)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)  # its note on persistent managers

    tok, eos = lm.tokenizer, lm.tokenizer.eos_token_id
    inputs = [tok(p.prompt)["input_ids"] for p in prompts]
    pages = requests * math.ceil((max(map(len, inputs)) + max_new) / PAGE)
    config = ContinuousBatchingConfig(
        page_size=PAGE,
        num_blocks=2 * pages,
        # tokens a forward pass may take (prefill chunks and decode rows): on this CPU 256 was the best of
        # 256-4,096 in a quick sweep (docs/performance.md); a GPU takes whole prefills in one pass
        max_batch_tokens=2048 if lm.device.type == "cuda" else 256,
        max_requests_per_batch=requests,
        auto_switch_to_flash=False,
    )
    settings = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos)

    def run():
        out = lm.model.generate_batch(
            inputs=inputs, generation_config=settings, continuous_batching_config=config, persistent_manager=True
        )
        ids = [list(o.generated_tokens) for o in out.values()]
        if len(ids) != len(inputs) or any(o.error for o in out.values()):
            raise RuntimeError(f"generate_batch returned {len(ids)} of {len(inputs)} requests")
        ids = [row[: row.index(eos) + 1] if eos in row else row for row in ids]
        return sum(len(strip(row, eos)) for row in ids), ids

    return run


def compare_cb(runtime, lm, model, args) -> dict:
    """vs_transformers_cb: decodebench (continuous refill, batch `args.batch`) against generate_batch."""
    prompts = mixed_prompts(lm.tokenizer, args.prompts)
    try:  # building the side imports transformers' continuous batching: inside, so a release without it is recorded
        theirs = hand_cb(lm, prompts, args.batch, args.new)
        theirs()  # builds and warms the manager, untimed (as decodebench's model warm-up is)
        sides = {"decodebench": ours(runtime, job(model, prompts, batch_size=args.batch, max_new=args.new))}
        sides["transformers_cb"] = theirs
        stats, outputs = rounds(sides, args.rounds, runtime.device)
    except Exception as err:  # an older or newer transformers: the other comparisons still stand
        print(f"{'vs_transformers_cb':24s} not run: {type(err).__name__}: {err}")
        return {"vs_transformers_cb": {"ratio": None, "error": f"{type(err).__name__}: {err}"}}
    finally:
        destroy = getattr(lm.model, "destroy_cached_continuous_batching_manager", None)
        if destroy is not None:
            destroy()
    note = f"({args.batch} requests at once, no stop string)"
    eos = lm.tokenizer.eos_token_id
    r, identical = against("vs_transformers_cb", stats, outputs, "transformers_cb", "generate_batch", eos, note)
    detail = {"ratio": r, **stats, "identical_outputs": identical, "requests_at_once": args.batch}
    return {"vs_transformers_cb": {**detail, "page_size": PAGE, "attention": "sdpa"}}
