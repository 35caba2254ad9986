"""Role formatting derived from a model's own chat template.

A program's text only grows (so the radix cache can reuse every prefix), so roles are
rendered as fixed strings around each message: `prefix + content + suffix`. We derive
those strings from the model's Jinja chat template by rendering small conversations with a
marker as the content and taking the difference, so the result is what
`apply_chat_template` would produce for the same messages.

The first message of a conversation gets its own prefix (`first_prefix`): templates put
the BOS text or a default system prompt there. A leading BOS token is dropped because the
runtime's tokenizer adds it itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixgen.errors import UnsupportedFeatureError
from radixgen.ir import ROLES

# Renders OpenAI-style messages to text: render(messages) -> str.
RenderFn = Callable[[list[dict[str, str]]], str]

_MARKER = "RADIXGEN_ROLE_CONTENT_MARKER"
_FILLER = {"system": "S", "user": "U", "assistant": "A"}


@dataclass(frozen=True)
class RoleAffixes:
    prefix: str
    suffix: str


@dataclass(frozen=True)
class ChatTemplate:
    """Per-role prefix/suffix strings; roles missing from the dicts are unsupported."""

    affixes: dict[str, RoleAffixes] = field(default_factory=dict)
    first_prefix: dict[str, str] = field(default_factory=dict)

    def begin(self, role: str, is_first_message: bool) -> str:
        self._check(role)
        if is_first_message and role in self.first_prefix:
            return self.first_prefix[role]
        return self.affixes[role].prefix

    def end(self, role: str) -> str:
        self._check(role)
        return self.affixes[role].suffix

    def _check(self, role: str) -> None:
        if role not in self.affixes:
            raise UnsupportedFeatureError(
                f"this model's chat template cannot render a {role!r} message here; "
                f"supported roles: {sorted(self.affixes)}"
            )


def chatml_template() -> ChatTemplate:
    """The ChatML layout (`<|im_start|>role\\n...<|im_end|>\\n`), for models without one."""
    affixes = {role: RoleAffixes(f"<|im_start|>{role}\n", "<|im_end|>\n") for role in ROLES}
    return ChatTemplate(affixes=affixes)


def derive_chat_template(render: RenderFn, bos_token: str | None = None) -> ChatTemplate:
    """Derives role affixes from `render` (e.g. a tokenizer's apply_chat_template).

    Each role is probed after the messages that usually precede it (system first, user
    after system, assistant after user). A role the template rejects is left out.
    """
    contexts = {
        "system": [],
        "user": [{"role": "system", "content": _FILLER["system"]}],
        "assistant": [
            {"role": "system", "content": _FILLER["system"]},
            {"role": "user", "content": _FILLER["user"]},
        ],
    }
    affixes: dict[str, RoleAffixes] = {}
    first_prefix: dict[str, str] = {}
    for role in ROLES:
        probed = _probe(render, contexts[role], role)
        if probed is None and contexts[role]:
            # e.g. a template without a system role: probe after the user message only
            probed = _probe(render, [m for m in contexts[role] if m["role"] != "system"], role)
        if probed is not None:
            affixes[role] = probed
        first = _probe(render, [], role)
        if first is not None:
            first_prefix[role] = _strip_bos(first.prefix, bos_token)
            affixes.setdefault(role, RoleAffixes(first_prefix[role], first.suffix))
    if not affixes:
        raise UnsupportedFeatureError("the chat template rendered no role with a marker")
    return ChatTemplate(affixes=affixes, first_prefix=first_prefix)


def _probe(render: RenderFn, context: list[dict[str, str]], role: str) -> RoleAffixes | None:
    """The text the template adds for one `role` message after `context`, split at the
    marker; None when the template rejects the conversation or reshapes earlier text."""
    try:
        before = render(context) if context else ""
        after = render([*context, {"role": role, "content": _MARKER}])
    except Exception:  # templates reject unsupported orders with arbitrary exceptions
        return None
    if not after.startswith(before) or after.count(_MARKER) != 1:
        return None
    prefix, _, suffix = after[len(before) :].partition(_MARKER)
    return RoleAffixes(prefix, suffix)


def _strip_bos(text: str, bos_token: str | None) -> str:
    if bos_token and text.startswith(bos_token):
        return text[len(bos_token) :]
    return text


def jinja_renderer(template: str, special_tokens: dict[str, str | None]) -> RenderFn:
    """A renderer for a raw Jinja chat template (what HF's apply_chat_template does).

    Used by HTTP backends, which get the template text from the server instead of holding
    a tokenizer. `special_tokens` (bos_token, eos_token, ...) are template variables.
    """
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    compiled = environment.from_string(template)

    def render(messages: list[dict[str, str]]) -> str:
        return compiled.render(
            messages=messages,
            add_generation_prompt=False,
            **{name: value or "" for name, value in special_tokens.items()},
        )

    return render
