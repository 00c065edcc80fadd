"""Chat models: which prompts a model's chat template renders, and the conversation it renders.

One home for the rules both planes apply (docs/tasks.md, "Chat models"): `decodebench validate`,
`run` and the submission server check them where a model's files can be read
(controller.sweep.chat), and the engine again before it renders (worker.engine.chat).

- `uses_chat(model, has_template)`: `chat: auto` renders where the tokenizer has a template;
  `true` and `false` say so;
- `chat_refusal(model, has_template, item)`: one line naming the prompt and the model, or None:
  `chat: true` for a model without a template, `messages` for a `chat: auto` model without one
  (`chat: false` is the explicit choice of the raw `prompt`: the item's, or its last user turn),
  `messages` without a user turn for a model that renders them (NO_USER_TURN, as prompt sets refuse it), or
  ending with an assistant turn (ASSISTANT_LAST);
- `settings_refusal(model, has_template)`: one line naming the model where it sets `system` or
  `chat_template_kwargs` but takes raw prompts (they would be dropped in silence), or None;
- `conversation(item, model)`: the messages rendered: the item's own, or its prompt as the user's
  turn, the model's `system` first where the conversation has no system turn;
- `template_sha256(template)`: the template's hash, recorded in result.json.

Light: no transformers, no jinja.
"""

from __future__ import annotations

import hashlib

from worker.core.contract import ModelSpec, PromptItem
from worker.core.errors import short

# A conversation the template renders without a user turn: the model would never see the item's `prompt`.
NO_USER_TURN = "`messages` has no user turn; a conversation needs one (put the prompt in a user message)"
# The template closes a last assistant turn and opens a new one: the model would not continue that text.
ASSISTANT_LAST = (
    "`messages` ends with an assistant turn, which the template closes before the model's own turn (the model "
    "would not continue it); end the conversation with a user turn"
)


def uses_chat(model: ModelSpec, has_template: bool) -> bool:
    """Whether the model's prompts are rendered with its chat template."""
    return has_template if model.chat == "auto" else bool(model.chat)


def chat_refusal(model: ModelSpec, has_template: bool, item: PromptItem) -> str | None:
    """Why `item` cannot be given to `model` (one line naming both), or None."""
    where = f"prompt {short(item.id)}, model {short(model.label)}"
    if model.chat is True and not has_template:
        return f"{where}: chat: true, but the model's tokenizer has no chat template"
    if item.messages is not None and model.chat == "auto" and not has_template:
        return (
            f"{where}: the prompt is a conversation (`messages`, or a `system` field), but the model's tokenizer "
            "has no chat template (chat: false feeds it the raw `prompt`)"
        )
    if item.messages is not None and uses_chat(model, has_template):
        if all(m.role != "user" for m in item.messages):
            return f"{where}: {NO_USER_TURN}"
        if item.messages[-1].role == "assistant":
            return f"{where}: {ASSISTANT_LAST}"
    return None


def settings_refusal(model: ModelSpec, has_template: bool | None) -> str | None:
    """One line where `model` sets `system` or `chat_template_kwargs` but takes raw prompts (`chat: false`, or
    `chat: auto` without a template), which would never send them; None where it renders them, or where
    `has_template` is unknown (None: its tokenizer files are not readable here)."""
    given = "system" if model.system is not None else "chat_template_kwargs" if model.chat_template_kwargs else None
    if given is None or (model.chat == "auto" and has_template is not False) or model.chat is True:
        return None
    why = "chat: false feeds it the raw prompt" if model.chat is False else "its tokenizer has no chat template"
    return f"model {short(model.label)}: `{given}` is set, but {why}, so the model would never see it"


def conversation(item: PromptItem, model: ModelSpec) -> list[dict[str, str]]:
    """The messages the template renders for `item` on `model`."""
    if item.messages is not None:
        messages = [m.model_dump() for m in item.messages]
    else:
        messages = [{"role": "user", "content": item.prompt}]
    if model.system is not None and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": model.system})
    return messages


def template_sha256(template: str) -> str:
    """sha256 of the template's text, as result.json records it."""
    return hashlib.sha256(template.encode()).hexdigest()
