"""The chat format the job contract carries (worker.core.contract): a conversation's turns in the OpenAI
chat format, and the names a model's `chat_template_kwargs` may not take. The rules over them live in
worker.core.chat (docs/tasks.md, "Chat models")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ChatRole = Literal["system", "user", "assistant"]
CHAT_ROLES: tuple[str, ...] = ("system", "user", "assistant")
# apply_chat_template's own arguments and what it gives every template: no chat_template_kwargs key may name one
CHAT_RESERVED = frozenset(
    ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt", "tokenize",
     "continue_final_message", "sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors",
     "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token", "eos_token", "unk_token",
     "sep_token", "pad_token", "cls_token", "mask_token")
)  # fmt: skip


class ChatMessage(BaseModel):
    """One turn of a conversation, in the OpenAI chat format."""

    model_config = ConfigDict(extra="forbid")

    role: ChatRole = Field(description="system, user or assistant.")
    content: str = Field(description="The turn's text.")


def template_variables(v: dict[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs` checked: identifiers, none of apply_chat_template's own names."""
    for key in v:
        if not key.isidentifier() or key in CHAT_RESERVED:
            raise ValueError(
                f"{key[:40]!r} cannot be a template variable (an identifier, not one of apply_chat_template's own "
                "arguments or special tokens)"
            )
    return v
