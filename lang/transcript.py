"""`Transcript`: a program's text plus the chat messages it contains.

Text is append-only. Role markers append the chat template's prefix/suffix strings and
record where each message's content starts, so `messages()` can cut the contents back
out. Shared by the executor (real runs) and the prefix tracer (dry runs for run_batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixgen.chat_template import ChatTemplate
from radixgen.errors import RoleNestingError


@dataclass
class OpenRole:
    role: str
    content_start: int  # offset in the text where the message content begins


@dataclass
class Transcript:
    text: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    open_role: OpenRole | None = None

    def add_text(self, text: str) -> str:
        self.text += text
        return text

    def begin_role(self, role: str, template: ChatTemplate) -> str:
        """Appends the role's prefix; returns the appended text."""
        if self.open_role is not None:
            raise RoleNestingError(
                f"cannot open a {role!r} message inside the open {self.open_role.role!r} one"
            )
        is_first_message = not self.messages and self.text == ""
        prefix = template.begin(role, is_first_message)
        self.text += prefix
        self.open_role = OpenRole(role, len(self.text))
        return prefix

    def end_role(self, role: str, template: ChatTemplate) -> str:
        """Closes the open message; returns the appended suffix."""
        if self.open_role is None or self.open_role.role != role:
            current = self.open_role.role if self.open_role else None
            raise RoleNestingError(f"cannot close {role!r}: the open role is {current!r}")
        content = self.text[self.open_role.content_start :]
        self.messages.append({"role": role, "content": content})
        self.open_role = None
        suffix = template.end(role)
        self.text += suffix
        return suffix

    def messages_with_open(self) -> list[dict[str, str]]:
        """The finished messages, plus the open one's content so far."""
        messages = [dict(message) for message in self.messages]
        if self.open_role is not None:
            content = self.text[self.open_role.content_start :]
            messages.append({"role": self.open_role.role, "content": content})
        return messages

    def copy(self) -> Transcript:
        open_role = OpenRole(**vars(self.open_role)) if self.open_role else None
        return Transcript(self.text, [dict(m) for m in self.messages], open_role)
