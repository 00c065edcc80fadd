#!/usr/bin/env python
"""Train the two bundled demo models and the held-out prompt set.

Data: Jane Austen's six novels (public domain), taken from Debian's
``r-cran-janeaustenr`` package, whose R lazy-load database is parsed here
without R. Five novels train one byte-level BPE tokenizer and two
GPT-2-architecture causal LMs (``austen-tiny``, ``austen-small``); the sixth,
*Persuasion*, is held out for evaluation and for the prompt set.

Everything is deterministic given ``--seed`` and ``--threads`` (CPU only).
Outputs, in Hugging Face format:

    examples/models/austen-tiny/     model + tokenizer + model card
    examples/models/austen-small/    model + tokenizer + model card
    examples/models/train.log        this script's full log
    examples/prompts/austen-heldout.jsonl, examples/prompts/README.md

Needs root (for ``apt-get download``), dpkg-deb, torch, transformers and
tokenizers.  Smoke test: ``python examples/train_models.py --quick``.
"""

import argparse
import json
import math
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from austen_corpus import DEB, HELDOUT, NOVELS, SENTENCE_END, clean_novel, fetch_novels, prompts_readme

EXAMPLES = Path(__file__).resolve().parent
EOS = "<|endoftext|>"
VOCAB_SIZE = 4096
SEQ_LEN = 128
BATCH = 8
N_POSITIONS = 256
MODELS = {  # name -> architecture and peak learning rate
    "austen-tiny": dict(n_embd=128, n_layer=2, n_head=4, lr=3e-3),
    "austen-small": dict(n_embd=256, n_layer=3, n_head=4, lr=2.5e-3),
}
SANITY_PROMPTS = 3


class Log:
    """Print messages and append them to a log file."""

    def __init__(self, path):
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (open for the whole run)

    def __call__(self, msg=""):
        print(msg, flush=True)
        self.file.write(msg + "\n")
        self.file.flush()


def train_tokenizer(texts):
    """Train the shared byte-level BPE tokenizer and wrap it for transformers."""
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOS], show_progress=False)
    return GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token=EOS, eos_token=EOS, unk_token=EOS, model_max_length=N_POSITIONS
    )


def encode(tokenizer, texts):
    """Encode documents into one token stream, each followed by EOS."""
    ids = []
    for text in texts:
        ids += tokenizer.backend_tokenizer.encode(text).ids + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def make_prompts(paragraphs, seed, count=128):
    """Pick `count` prompt/reference pairs from held-out paragraphs.

    The prompt is a paragraph's first 12-20 words; the reference is the next
    40-60 words, ended at the last sentence end in that range when there is one.
    """
    rng = random.Random(seed)
    candidates = [(i, p.split()) for i, p in enumerate(paragraphs) if len(p.split()) >= 80]
    items = []
    for index, words in sorted(rng.sample(candidates, count)):
        cut = rng.randint(12, 20)
        rest = words[cut : cut + 60]
        ends = [n for n in range(40, len(rest) + 1) if SENTENCE_END.search(rest[n - 1])]
        rest = rest[: ends[-1]] if ends else rest
        items.append({"id": f"{HELDOUT}-{index:04d}", "prompt": " ".join(words[:cut]), "reference": " ".join(rest)})
    return items


def lr_factor(step, steps, warmup):
    """Linear warmup, then cosine decay to 10% of the peak learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def lm_loss(model, chunk):
    """Mean next-token cross-entropy of a [batch, SEQ_LEN + 1] chunk."""
    logits = model(input_ids=chunk[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), chunk[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, ids, windows):
    """Mean loss over `windows` evenly spaced, fixed windows of a token stream."""
    model.eval()
    starts = torch.linspace(0, len(ids) - SEQ_LEN - 2, windows).long()
    chunks = torch.stack([ids[s : s + SEQ_LEN + 1] for s in starts])
    loss = (
        sum(lm_loss(model, chunks[i : i + 32]).item() * len(chunks[i : i + 32]) for i in range(0, windows, 32))
        / windows
    )
    model.train()
    return loss


def new_model(spec, tokenizer):
    """A GPT-2 of the given size with freshly initialised weights (seed torch first)."""
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=N_POSITIONS,
        n_embd=spec["n_embd"],
        n_layer=spec["n_layer"],
        n_head=spec["n_head"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return GPT2LMHeadModel(config)


def make_optimizer(model, spec, steps):
    """AdamW (weight decay on matrices only) with linear warm-up and cosine decay."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec["lr"],
        betas=(0.9, 0.95),
    )
    warmup = max(1, min(100, steps // 10))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps, warmup))
    return optimizer, scheduler, warmup


def optimize(model, optimizer, scheduler, loss, running):
    """One step on `loss` (gradients clipped to norm 1); the running mean of the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    return loss.item() if running is None else 0.95 * running + 0.05 * loss.item()


def train_model(name, spec, tokenizer, train_ids, heldout_ids, steps, seed, eval_windows, log):
    """Train one model from scratch with AdamW; return it and its statistics."""
    torch.manual_seed(seed)
    model = new_model(spec, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    optimizer, scheduler, warmup = make_optimizer(model, spec, steps)
    data_order = torch.Generator().manual_seed(seed)
    log(
        f"== {name}: {params:,} parameters, {steps} steps, batch {BATCH} x {SEQ_LEN} tokens, "
        f"peak lr {spec['lr']}, warmup {warmup}"
    )
    start, running = time.time(), None
    every = max(1, steps // 20)
    for step in range(steps):
        starts = torch.randint(0, len(train_ids) - SEQ_LEN - 1, (BATCH,), generator=data_order)
        loss = lm_loss(model, torch.stack([train_ids[s : s + SEQ_LEN + 1] for s in starts]))
        running = optimize(model, optimizer, scheduler, loss, running)
        if (step + 1) % every == 0 or step + 1 == steps:
            log(
                f"{name} step {step + 1:5d}/{steps}  loss {running:.3f}  "
                f"lr {scheduler.get_last_lr()[0]:.2e}  {time.time() - start:6.0f}s"
            )
    train_time = time.time() - start
    stats = {
        "params": params,
        "steps": steps,
        "warmup": warmup,
        "train_seconds": train_time,
        "train_loss": evaluate(model, train_ids, eval_windows),
        "heldout_loss": evaluate(model, heldout_ids, eval_windows),
        **spec,
    }
    log(
        f"{name} done in {train_time:.0f}s: train loss {stats['train_loss']:.3f} "
        f"(ppl {math.exp(stats['train_loss']):.1f}), held-out loss {stats['heldout_loss']:.3f} "
        f"(ppl {math.exp(stats['heldout_loss']):.1f})"
    )
    return model, stats


def model_card(name, stats, args, corpus, eval_windows):
    """Markdown model card for one trained model."""
    train_novels = ", ".join(f"*{NOVELS[n]}*" for n in NOVELS if n != HELDOUT)
    tl, hl = stats["train_loss"], stats["heldout_loss"]
    return f"""# {name}

A {stats["params"] / 1e6:.2f}M-parameter GPT-2-architecture causal language model trained
from scratch on Jane Austen's novels, bundled with decodebench to demonstrate decoding
strategies (greedy looping, sampling variety) on a CPU. It writes Austen-flavoured English
fragments; it is not useful for anything else.

## Data
- Source: Debian package `{DEB}` (`{corpus["deb"]}`), an R lazy-load database of the six
  novels as released by Project Gutenberg (public domain), parsed without R.
- Cleaning: title pages, chapter/volume headings and end matter dropped; lines joined into
  paragraphs, italics underscores removed, whitespace collapsed; paragraphs joined with a
  blank line, each novel followed by `{EOS}`.
- Trained on: {train_novels} ({corpus["train_tokens"]:,} tokens).
- Held out: *{NOVELS[HELDOUT]}* ({corpus["heldout_tokens"]:,} tokens), used for the held-out
  loss and for `examples/prompts/austen-heldout.jsonl`.

## Tokenizer
Byte-level BPE trained with `tokenizers` on the training novels; vocabulary {VOCAB_SIZE}
including the single special token `{EOS}` (bos = eos = unk; no pad token; the generation
config uses it as pad). No prefix space; no special tokens are added when encoding.
Shared by both bundled models.

## Architecture
`GPT2LMHeadModel`: {stats["n_layer"]} layers, {stats["n_head"]} heads, embedding
{stats["n_embd"]}, context {N_POSITIONS}, tied input/output embeddings, no dropout;
{stats["params"]:,} parameters, stored as fp32 safetensors.

## Training
- {stats["steps"]} steps of batch {BATCH} x {SEQ_LEN} tokens
  ({stats["steps"] * BATCH * SEQ_LEN / 1e6:.1f}M tokens), windows drawn at random offsets
  from a generator seeded with the seed.
- AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), gradient clipping 1.0; peak
  learning rate {stats["lr"]}, linear warmup {stats["warmup"]} steps, cosine decay to 10%.
- Seed {args.seed}; `torch.set_num_threads({args.threads})`; CPU only; training took
  {stats["train_seconds"] / 60:.1f} min (torch {torch.__version__},
  transformers {transformers.__version__}, {platform.machine()}).

## Results
Mean next-token loss over {eval_windows} fixed, evenly spaced {SEQ_LEN}-token windows:

| split | loss | perplexity |
| --- | --- | --- |
| train (five novels) | {tl:.3f} | {math.exp(tl):.1f} |
| held out (*{NOVELS[HELDOUT]}*) | {hl:.3f} | {math.exp(hl):.1f} |

## Rebuild
From the repository root, as root (it runs `apt-get download {DEB}`):

    {rebuild_command(args)}

This rebuilds both models, the tokenizer and the prompt set; results are deterministic for
a given seed, thread count and library versions.
"""


def rebuild_command(args):
    """The command line that reproduces this run."""
    return (
        f"python examples/train_models.py --seed {args.seed} --threads {args.threads} "
        f"--steps-tiny {args.steps_tiny} --steps-small {args.steps_small}"
    )


def save_model(model, tokenizer, directory):
    """Save model (safetensors), generation config and tokenizer."""
    eos = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def sanity_check(out, names, prompts, log):
    """Reload each saved model and print greedy and sampled continuations."""
    log("== sanity check: reloaded models, 30 new tokens")
    for name in names:
        directory = out / name
        model = AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        for item in prompts[:SANITY_PROMPTS]:
            inputs = tokenizer(item["prompt"], return_tensors="pt")
            torch.manual_seed(0)
            sampled = {"do_sample": True, "temperature": 0.8, "top_p": 0.95}
            for label, kwargs in (("greedy", {"do_sample": False}), ("sample", sampled)):
                output = model.generate(**inputs, max_new_tokens=30, **kwargs)
                text = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])
                log(f"[{name} {label}] {item['prompt']} >>> {text!r}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (the committed weights were trained with 1)"
    )
    parser.add_argument("--out", type=Path, help="models directory (default examples/models)")
    parser.add_argument("--prompts-out", type=Path, help="prompt set directory (default examples/prompts)")
    parser.add_argument("--steps-tiny", type=int, default=800)
    parser.add_argument("--steps-small", type=int, default=1300)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 20 steps each, written under a temporary directory unless --out/--prompts-out are given",
    )
    args = parser.parse_args()
    args.eval_windows = 128
    if args.quick:
        args.steps_tiny = args.steps_small = 20
        args.eval_windows = 32
        scratch = Path(tempfile.mkdtemp(prefix="austen-quick-"))
        args.out = args.out or scratch / "models"
        args.prompts_out = args.prompts_out or scratch / "prompts"
    return args


def build_corpus(log, began):
    """The cleaned novels, the tokenizer and the token ids of the training and held-out text."""
    with tempfile.TemporaryDirectory() as workdir:
        deb, raw = fetch_novels(workdir)
    novels = {name: clean_novel(raw[name]) for name in NOVELS}
    for name, paragraphs in novels.items():
        log(f"{NOVELS[name]}: {len(paragraphs)} paragraphs, {sum(len(p.split()) for p in paragraphs):,} words")
    train_texts = ["\n\n".join(novels[n]) for n in NOVELS if n != HELDOUT]
    tokenizer = train_tokenizer(train_texts)
    train_ids = encode(tokenizer, train_texts)
    heldout_ids = encode(tokenizer, ["\n\n".join(novels[HELDOUT])])
    corpus = {"deb": deb, "train_tokens": len(train_ids), "heldout_tokens": len(heldout_ids)}
    log(
        f"tokenizer: vocab {len(tokenizer)}; train {len(train_ids):,} tokens, "
        f"held-out {len(heldout_ids):,} tokens ({time.time() - began:.0f}s)"
    )
    return novels, tokenizer, train_ids, heldout_ids, corpus


def main():
    """Parse flags, build data, tokenizer and models, write everything out."""
    args = parse_args()
    eval_windows = args.eval_windows
    out = args.out or EXAMPLES / "models"
    prompts_dir = args.prompts_out or EXAMPLES / "prompts"
    out.mkdir(parents=True, exist_ok=True)
    prompts_dir.mkdir(parents=True, exist_ok=True)
    log = Log(out / "train.log")
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    began = time.time()
    log(
        f"decodebench Austen models: {rebuild_command(args)}\n"
        f"out {out}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    novels, tokenizer, train_ids, heldout_ids, corpus = build_corpus(log, began)
    deb = corpus["deb"]

    prompts = make_prompts(novels[HELDOUT], args.seed)
    with open(prompts_dir / "austen-heldout.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in prompts)
    (prompts_dir / "README.md").write_text(
        prompts_readme(prompts, args.seed, deb, rebuild_command(args)), encoding="utf-8"
    )
    log(f"wrote {len(prompts)} prompts to {prompts_dir}")

    for name, steps in (("austen-tiny", args.steps_tiny), ("austen-small", args.steps_small)):
        model, stats = train_model(
            name, MODELS[name], tokenizer, train_ids, heldout_ids, steps, args.seed, eval_windows, log
        )
        save_model(model, tokenizer, out / name)
        (out / name / "README.md").write_text(model_card(name, stats, args, corpus, eval_windows), encoding="utf-8")

    sanity_check(out, list(MODELS), prompts, log)
    log(f"total wall time {(time.time() - began) / 60:.1f} min")


if __name__ == "__main__":
    main()
