"""Chat templates at validation: every prompt a chat model gets is rendered here, where the model's files
can be read, so that a bad conversation is refused before any job exists (docs/tasks.md).

A local model directory's template is read as transformers reads it (`chat_template.jinja`, else
`tokenizer_config.json`'s `chat_template`), and rendered in a jinja sandbox with the variables and
helpers transformers gives a template (its special tokens, `raise_exception`, `tojson`,
`strftime_now`, the `{% generation %}` tag), `add_generation_prompt` on. The worker renders with transformers'
`apply_chat_template` itself (worker.engine.chat) and applies the same rules again; a hub id, or a path
only the workers see, is checked there. The rules themselves live in worker.core.chat.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from worker.core.chat import chat_refusal, conversation, settings_refusal, uses_chat
from worker.core.contract import ModelSpec, PromptItem
from worker.core.errors import UsageError, short, shown

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class LocalTemplate:
    """A local model directory's chat template (None: it has none) and the special tokens it may name."""

    template: str | None
    special: dict[str, str]


def _token(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def local_template(path: str) -> LocalTemplate | None:
    """The directory's template, or None where its tokenizer files cannot be read here (a hub id)."""
    folder = Path(path)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers uses the one called "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    with contextlib.suppress(OSError):  # transformers 5 writes the template to its own file
        template = (folder / "chat_template.jinja").read_text()
    special = {k: tok for k in SPECIAL_TOKENS if (tok := _token(config.get(k))) is not None}
    return LocalTemplate(template if isinstance(template, str) and template else None, special)


def _generation_tag():
    """transformers' `{% generation %}` ... `{% endgeneration %}` (it marks the assistant's tokens for a training
    mask; apply_chat_template compiles it): rendered as its body."""
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return Generation


def _environment():
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _generation_tag()]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: dt.datetime.now().strftime(fmt)
    return env


def rendered_prompts(model: ModelSpec, prompts: list[PromptItem]) -> list[str] | None:
    """The texts `model`'s template renders for `prompts` (None: the model takes raw prompts, or its files
    are not readable here); a UsageError naming the prompt and the model for one it cannot take."""
    local = local_template(model.path)
    if why := settings_refusal(model, None if local is None else local.template is not None):
        raise UsageError(why)
    if local is None:
        return None
    has_template = local.template is not None
    for item in prompts:
        if why := chat_refusal(model, has_template, item):
            raise UsageError(why)
    if not uses_chat(model, has_template):
        return None
    try:
        template = _environment().from_string(local.template)
    except Exception as err:  # jinja's TemplateSyntaxError, or anything a broken template raises
        why = shown(str(err), 160)
        raise UsageError(f"model {short(model.label)}: its chat template does not compile: {why}") from None
    texts = []
    for item in prompts:
        try:
            texts.append(
                template.render(
                    messages=conversation(item, model),
                    add_generation_prompt=True,
                    **local.special,
                    **model.chat_template_kwargs,
                )
            )
        except Exception as err:  # raise_exception's TemplateError, a sandbox refusal, a type error in the template
            where = f"prompt {short(item.id)}, model {short(model.label)}"
            raise UsageError(f"{where}: the chat template fails to render: {shown(str(err), 160)}") from None
    return texts


def sent_text(model: ModelSpec, item: PromptItem) -> tuple[str, str | None]:
    """What `model` is fed for `item`, as `validate --show-prompt` prints it: (how, text); the text None where
    the worker renders it (the model's files are not readable here: a hub id)."""
    rendered = rendered_prompts(model, [item])
    if rendered is not None:
        return "its chat template", rendered[0]
    local = local_template(model.path)
    if local is None and model.chat is not False:
        return "rendered by the worker: its tokenizer files are not readable here", None
    return "the raw prompt text, tokenised with the tokenizer's special tokens", item.prompt
