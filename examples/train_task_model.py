#!/usr/bin/env python
"""Train the bundled task model, `adder-tiny`, and its prompt set (docs/tasks.md, examples/tasks.yaml).

The task: add two numbers of 2 or 3 digits, with a short worked answer, column by column from the
right, the carry written out, then the sum after `#`:

    prompt      386+457=?
    completion   6+7=13 8+5+1=14 3+4+1=8 #843<|endoftext|>

A character-level GPT-2 (the byte-level tokenizer of the Austen models with no merges: one token per
character) is trained from scratch on random problems for a few minutes on the CPU, on purpose not
to perfection: greedy decoding gets most answers right, and every sampled token of the worked answer
is a chance to go wrong, so accuracy visibly depends on the decoding strategy and the temperature.
The prompt set holds problems the training never saw, each with its gold `answer`.

Everything is deterministic given ``--seed`` and ``--threads`` (CPU only). Outputs:

    examples/models/adder-tiny/           model + tokenizer + model card
    examples/models/adder-tiny/train.log  this script's log
    examples/prompts/addition.jsonl       the held-out problems with their answers

Run: ``nice -n 19 python examples/train_task_model.py`` (about 3 minutes on one core);
``--quick`` for a smoke test.
"""

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import ByteLevelBPETokenizer
from transformers import GenerationConfig, GPT2TokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_models import EOS, Log, make_optimizer, new_model, optimize

EXAMPLES = Path(__file__).resolve().parent
NAME = "adder-tiny"
SPEC = dict(n_embd=96, n_layer=2, n_head=3, lr=3e-3)  # head size 32: one vLLM's CPU attention runs
BATCH = 48
N_PROMPTS = 128


def problem(rng: random.Random) -> tuple[int, int]:
    digits = rng.choice((2, 3)), rng.choice((2, 3))
    return tuple(rng.randint(10 ** (d - 1), 10**d - 1) for d in digits)  # type: ignore[return-value]


def prompt_of(a: int, b: int) -> str:
    return f"{a}+{b}=?\n"


def worked(a: int, b: int) -> str:
    """The columns from the right, each `x+y(+1)=s`, then `#` and the sum."""
    xs, ys = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(xs), len(ys))):
        x, y = int(xs[i]) if i < len(xs) else 0, int(ys[i]) if i < len(ys) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}{'+1' if carry else ''}={s}")
        carry = s // 10
    return " ".join(steps) + f" #{a + b}"


def tokenizer_of(out: Path) -> GPT2TokenizerFast:
    """One token per byte: the byte-level BPE with no merges, and EOS."""
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(["0123456789+=?#\n "], vocab_size=257, min_frequency=1, special_tokens=[EOS],
                            show_progress=False)  # fmt: skip
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                            model_max_length=64)  # fmt: skip
    tok.save_pretrained(out)
    return tok


def batch(tok, rng: random.Random, held: set, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and the loss mask (the completion and its EOS only), right-padded with EOS."""
    rows, masks = [], []
    while len(rows) < size:
        a, b = problem(rng)
        if (a, b) in held:
            continue
        p = tok(prompt_of(a, b)).input_ids
        c = tok(worked(a, b)).input_ids + [tok.eos_token_id]
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.eos_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    return ids, mask


@torch.no_grad()
def greedy_accuracy(model, tok, items) -> float:
    """The share of `items` whose greedy answer (after `#`) is right, in one left-padded batch."""
    model.eval()
    tok.padding_side, tok.pad_token = "left", EOS
    enc = tok([item["prompt"] for item in items], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=40, do_sample=False, pad_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    model.train()
    return sum(t.rsplit("#", 1)[-1].strip() == item["answer"] for t, item in zip(texts, items)) / len(items)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--quick", action="store_true", help="a few steps into a temporary directory")
    ap.add_argument("--out", type=Path, default=EXAMPLES / "models" / NAME)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(tempfile.mkdtemp()) if args.quick else args.out
    steps = 20 if args.quick else args.steps
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "train.log")
    rng = random.Random(args.seed)
    held_problems = []
    while len(held_problems) < N_PROMPTS:
        if (ab := problem(rng)) not in held_problems:
            held_problems.append(ab)
    items = [{"id": f"add-{i:03d}", "prompt": prompt_of(a, b), "answer": str(a + b)}
             for i, (a, b) in enumerate(held_problems)]  # fmt: skip
    tok = tokenizer_of(out)
    model = new_model(SPEC, tok)
    optimizer, scheduler, warmup = make_optimizer(model, SPEC, steps)
    params = sum(p.numel() for p in model.parameters())
    log(f"== {NAME}: {params:,} parameters, {steps} steps of {BATCH} problems, lr {SPEC['lr']}, seed {args.seed}")
    start, running, held = time.time(), None, set(held_problems)
    for step in range(steps):
        ids, mask = batch(tok, rng, held, BATCH)
        logits = model(input_ids=ids[:, :-1]).logits
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        running = optimize(model, optimizer, scheduler, loss, running)
        if (step + 1) % max(1, steps // 10) == 0:
            log(f"step {step + 1:5d}/{steps}  loss {running:.4f}  {time.time() - start:5.0f}s")
    accuracy = greedy_accuracy(model, tok, items)
    log(f"greedy accuracy on the {len(items)} held-out problems: {accuracy:.3f} ({time.time() - start:.0f}s)")
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.eos_token_id).save_pretrained(out)  # fmt: skip
    (out / "README.md").write_text(
        f"# {NAME}\n\nA {params:,}-parameter character-level GPT-2 that adds numbers of 2 or 3 digits with a worked "
        f"answer (`386+457=?` → `6+7=13 8+5+1=14 3+4+1=8 #843`), trained from scratch by "
        f"`examples/train_task_model.py --seed {args.seed} --steps {steps}` ({steps} steps of {BATCH} random "
        f"problems). Greedy accuracy on `examples/prompts/addition.jsonl` (never trained on): {accuracy:.3f}. "
        "Made for `examples/tasks.yaml` (docs/tasks.md): not a useful calculator.\n"
    )
    if not args.quick:
        lines = "".join(json.dumps(item) + "\n" for item in items)
        (EXAMPLES / "prompts" / "addition.jsonl").write_text(lines)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
