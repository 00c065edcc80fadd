"""A job's prompts as token ids, rendered once: raw text, or a chat model's template (docs/tasks.md).

`prompt_ids(tok, job)` tokenises the shard's prompts once for the whole job: a model that takes raw
prompts gets the tokenizer's ids of each prompt's text, as before chat models; a chat model
(worker.core.chat: `chat: auto` with a template, or `chat: true`) gets
`tokenizer.apply_chat_template(conversation, add_generation_prompt=True)`'s ids, the model's
`chat_template_kwargs` passed to the template. Both engines feed these very ids (vLLM as token-id
prompts), every strategy the same. A prompt the model cannot take fails the job permanently in one
line naming the prompt and the model (validation refuses it first where the model's files are
readable there: controller.sweep.chat).

`encoded(tok, job)`: both at once for the plan (worker.engine.plan.configure): the ids by prompt id and
whether the model chats.

`end_ids(tok, eos)`: where a raw prompt's generation ends (the generation config's EOS list, else the
tokenizer's EOS). `stop_ids(tok, eos)`: a chat model's generation ends at its template's end of turn as well
as at EOS: the generation config's EOS list (e.g. Llama 3's `<|eot_id|>`, ChatML's `<|im_end|>`), the
tokenizer's EOS token and the added token the template writes after a reply (`turn_end`) together.

`chat_record(tok, job, ids)`: what result.json's `engine.chat` records: the template's sha256, the
system prompt and template variables, and each rendered prompt's token count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from worker.core.chat import chat_refusal, conversation, settings_refusal, template_sha256, uses_chat
from worker.core.contract import JobSpec
from worker.core.errors import PermanentJobError, short


def _template(tok) -> str | None:
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):  # named templates: apply_chat_template uses "default"
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def is_chat(tok, job: JobSpec) -> bool:
    """Whether the job's prompts are rendered with the model's chat template (`tok`: its tokenizer)."""
    return uses_chat(job.model, _template(tok) is not None)


def prompt_ids(tok, job: JobSpec) -> list[list[int]]:
    """Each of the shard's prompts as the token ids the model is fed, in the shard's order (`tok`: the model's
    tokenizer, transformers' own or the one vLLM holds)."""
    has_template = _template(tok) is not None
    if why := settings_refusal(job.model, has_template):
        raise PermanentJobError(why)
    for item in job.prompts:
        if why := chat_refusal(job.model, has_template, item):
            raise PermanentJobError(why)
    if not uses_chat(job.model, has_template):
        return tok([p.prompt for p in job.prompts])["input_ids"]
    rows = []
    for item in job.prompts:
        try:
            ids = tok.apply_chat_template(
                conversation(item, job.model),
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **job.model.chat_template_kwargs,
            )
        except Exception as err:  # jinja's TemplateError (raise_exception), a sandbox refusal, a type error
            raise PermanentJobError(
                f"prompt {short(item.id)}, model {short(job.model.label)}: the chat template fails to render: "
                f"{short(str(err), 160)}"
            ) from None
        rows.append(list(ids))
    return rows


class Prompts(NamedTuple):
    """A job's prompts as the model is fed them (by prompt id), and whether they are a chat model's turns."""

    ids: Mapping[str, list[int]]
    chat: bool = False


def encoded(tok, job: JobSpec) -> Prompts:
    """The job's prompts tokenised once (`prompt_ids`), by prompt id, and whether the model chats."""
    rows = prompt_ids(tok, job)
    return Prompts({p.id: row for p, row in zip(job.prompts, rows)}, is_chat(tok, job))


REPLY = "decodebench-reply"  # an assistant turn's text, to find what the template writes after it


def turn_end(tok) -> int | None:
    """The token the chat template writes right after an assistant's reply (Llama 3's <|eot_id|>, ChatML's
    <|im_end|>, Gemma's <end_of_turn>), where it is one of the tokenizer's added tokens; None where the template
    writes plain text there, or cannot render a user turn and a reply."""
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": REPLY}]
    try:
        text = tok.apply_chat_template(turns, tokenize=False)
    except Exception:  # a template that refuses this conversation: the generation config's ends only
        return None
    at = text.find(REPLY) if isinstance(text, str) else -1
    if at < 0:
        return None
    added = set(getattr(tok, "added_tokens_decoder", None) or ())  # a tokenizer without them: no token to find
    for token in tok(text[at + len(REPLY) :], add_special_tokens=False)["input_ids"]:
        if token in added:
            return token
        if tok.decode([token]).strip():  # plain text closes the turn: no token to stop at
            return None
    return None


def end_ids(tok, eos: int | list[int] | None) -> list[int]:
    """Where a raw prompt's generation ends: the generation config's EOS list (`eos`), the tokenizer's EOS token
    where it has none (as worker.engine.plan.generation_config reads them)."""
    if eos is None:
        return [] if tok.eos_token_id is None else [tok.eos_token_id]
    return [eos] if isinstance(eos, int) else list(eos)


def stop_ids(tok, eos: int | list[int] | None) -> list[int]:
    """The generation config's EOS list (`eos`) with the tokenizer's EOS token and the template's end of turn
    (`turn_end`, which a checkpoint's generation config may not list): every end of a chat model's turn."""
    ids = end_ids(tok, eos)
    for extra in (tok.eos_token_id, turn_end(tok)):
        if isinstance(extra, int) and extra not in ids:
            ids.append(extra)
    return ids


def chat_record(tok, job: JobSpec, ids: dict[str, list[int]]) -> dict[str, Any] | None:
    """result.json's `engine.chat` for a chat job (None for raw prompts): `system` the model's, which the prompts
    in `own_system` (their own system turn) did not get."""
    template = _template(tok)
    if not uses_chat(job.model, template is not None):
        return None
    return {
        "template_sha256": template_sha256(template),
        "system": job.model.system,
        "own_system": [
            p.id for p in job.prompts if p.messages is not None and any(m.role == "system" for m in p.messages)
        ],
        "template_kwargs": job.model.chat_template_kwargs,
        "prompt_tokens": {p.id: len(ids[p.id]) for p in job.prompts},
    }
