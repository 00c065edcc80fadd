#!/usr/bin/env python
"""Derive the bundled chat model ``austen-tiny-chat`` from ``austen-tiny``.

``austen-tiny``'s tokenizer gains the ChatML tokens ``<|im_start|>`` and ``<|im_end|>`` (special,
ids 4096 and 4097) and a ChatML chat template in its tokenizer config; the model's embedding
grows by their two rows (each starts as a copy of ``<|endoftext|>``'s) and is fine-tuned on
conversations rendered by that very template: a fixed system prompt, a paragraph's first 12-20
words as the user's turn, its next words up to a sentence end (at most 40) as the assistant's,
from the five training novels (never *Persuasion*, whose paragraphs make the prompt sets). So
the model answers in a turn and ends it with ``<|im_end|>``, which its generation config lists
as an end of sequence beside ``<|endoftext|>``. ``austen-tiny`` itself is read, never written:
its golden tokens stay as they are.

Writes ``examples/models/austen-tiny-chat/`` and ``examples/prompts/austen-chat.jsonl`` (32
conversations from the held-out prompt set). Deterministic given ``--seed``, ``--threads`` and the
library versions; needs what ``train_models.py`` needs (root for ``apt-get download``).
"""

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from austen_corpus import HELDOUT, NOVELS, SENTENCE_END, clean_novel, fetch_novels
from train_models import BATCH, SEQ_LEN, Log, lm_loss, make_optimizer

EXAMPLES = Path(__file__).resolve().parent
BASE = "austen-tiny"
NAME = "austen-tiny-chat"
SYSTEM = "You continue passages in the manner of Jane Austen."
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen's and many others' templates write it; a system turn, if any, comes first
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('the system turn must come first') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPEC = {"lr": 1e-3}


def conversations(paragraphs, rng):
    """(user, assistant) turns from paragraphs: the first 12-20 words, then up to a sentence end."""
    out = []
    for paragraph in paragraphs:
        words = paragraph.split()
        if len(words) < 30:
            continue
        cut = rng.randint(12, 20)
        rest = words[cut : cut + 40]
        ends = [n for n in range(5, len(rest) + 1) if SENTENCE_END.search(rest[n - 1])]
        if ends:
            out.append((" ".join(words[:cut]), " ".join(rest[: ends[0]])))
    return out


def chat_tokenizer():
    """austen-tiny's tokenizer with the ChatML tokens and template."""
    tokenizer = AutoTokenizer.from_pretrained(EXAMPLES / "models" / BASE)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def token_stream(tokenizer, pairs):
    """Every conversation rendered by the template, one token stream."""
    ids = []
    for user, reply in pairs:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user},
            {"role": "assistant", "content": reply},
        ]
        ids += tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    return torch.tensor(ids, dtype=torch.long)


def chat_model(tokenizer):
    """austen-tiny with two more embedding rows, each a copy of <|endoftext|>'s."""
    model = AutoModelForCausalLM.from_pretrained(EXAMPLES / "models" / BASE, use_safetensors=True)
    eos = tokenizer.eos_token_id
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        for token in (IM_START, IM_END):
            weight[tokenizer.convert_tokens_to_ids(token)] = weight[eos]
    return model


def finetune(model, ids, steps, seed, log):
    torch.manual_seed(seed)
    optimizer, scheduler, _ = make_optimizer(model, SPEC, steps)
    order = torch.Generator().manual_seed(seed)
    model.train()
    start, running = time.time(), None
    for step in range(steps):
        starts = torch.randint(0, len(ids) - SEQ_LEN - 1, (BATCH,), generator=order)
        loss = lm_loss(model, torch.stack([ids[s : s + SEQ_LEN + 1] for s in starts]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if (step + 1) % max(1, steps // 10) == 0:
            log(f"{NAME} step {step + 1:4d}/{steps}  loss {running:.3f}  {time.time() - start:5.0f}s")
    model.eval()
    return running


def chat_prompts(count=32):
    """The first `count` held-out prompts as conversations (the user's turn; the reference kept)."""
    lines = (EXAMPLES / "prompts" / "austen-heldout.jsonl").read_text(encoding="utf-8").splitlines()[:count]
    items = [json.loads(line) for line in lines]
    return [
        {"id": it["id"], "messages": [{"role": "user", "content": it["prompt"]}], "reference": it["reference"]}
        for it in items
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=EXAMPLES / "models" / NAME)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "train.log")
    command = f"python examples/chat_model.py --seed {args.seed} --threads {args.threads} --steps {args.steps}"
    log(f"{command}\ntorch {torch.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory() as workdir:
        _, raw = fetch_novels(workdir)
    rng = random.Random(args.seed)
    pairs = [pair for name in NOVELS if name != HELDOUT for pair in conversations(clean_novel(raw[name]), rng)]
    tokenizer = chat_tokenizer()
    ids = token_stream(tokenizer, pairs)
    log(f"{len(pairs):,} conversations, {len(ids):,} tokens")
    model = chat_model(tokenizer)
    loss = finetune(model, ids, args.steps, args.seed, log)
    eos = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    model.generation_config = GenerationConfig(bos_token_id=eos[0], eos_token_id=eos, pad_token_id=eos[0])
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out, save_jinja_files=False)  # the template in tokenizer_config.json
    config_file = args.out / "tokenizer_config.json"  # without the loader's notes of where it read austen-tiny
    config = {k: v for k, v in json.loads(config_file.read_text()).items() if k not in ("is_local", "local_files_only")}
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (args.out / "model.safetensors").chmod(0o644)
    prompts = chat_prompts()
    (EXAMPLES / "prompts" / "austen-chat.jsonl").write_text(
        "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8"
    )
    for item in prompts[:3]:
        conversation = [{"role": "system", "content": SYSTEM}, *item["messages"]]
        enc = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=40, do_sample=False)
        log(f"[greedy] {item['messages'][-1]['content']} >>> {tokenizer.decode(out[0, enc['input_ids'].shape[1] :])!r}")
    log(f"done: fine-tune loss {loss:.3f} (ppl {math.exp(loss):.1f}); {NAME} and austen-chat.jsonl written")
    (args.out / "README.md").write_text(CARD.format(steps=args.steps, loss=loss, n=len(pairs), tokens=len(ids),
                                                    command=command, seed=args.seed), encoding="utf-8")  # fmt: skip


CARD = """# austen-tiny-chat

`austen-tiny` (0.95M parameters, GPT-2 architecture, trained on five of Jane Austen's novels) made a
chat model for decodebench's chat tests and `examples/chat.yaml`: its tokenizer gains the ChatML
tokens `<|im_start|>` and `<|im_end|>` (special, ids 4096 and 4097) and a ChatML chat template in
`tokenizer_config.json`; its embedding grows by their two rows and it is fine-tuned for {steps} steps
(batch 8 x 128 tokens, AdamW, peak learning rate 0.001, seed {seed}) on {n:,} conversations
({tokens:,} tokens) rendered by that template: the system prompt "{system}", a paragraph's first
12-20 words as the user's turn, its next words up to a sentence end as the assistant's. Final
training loss {loss:.3f}. Its generation config ends a sequence at `<|endoftext|>` or `<|im_end|>`.
It writes Austen-flavoured fragments and ends its turn; it is not useful for anything else.

Rebuild (after `examples/train_models.py`, as root: it runs `apt-get download r-cran-janeaustenr`):

    {command}
""".replace("{system}", SYSTEM)


if __name__ == "__main__":
    main()
