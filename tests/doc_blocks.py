"""The fenced code blocks of the README and docs/*.md, for the tests that run them.

A block may be preceded (on the line right before its fence) by an HTML comment that says how
the docs test treats it:
    <!-- not run: REASON -->             never executed (REASON says why it cannot run here)
    <!-- continues the previous block --> runs after the previous ```python block of the same file,
                                          in its namespace (a fragment that uses its objects)
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_FENCE = re.compile(
    r"(?:<!--(?P<note>(?:(?!-->).)*)-->\n)?```(?P<lang>[a-z]*)\n(?P<code>.*?)```", flags=re.DOTALL
)
_NOT_RUN = re.compile(r"not run:\s*(?P<reason>.*)", flags=re.DOTALL)
_CONTINUES = "continues the previous block"


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: `file` relative to the repository, `index` among the file's blocks of
    the same language, `note` the HTML comment right before the fence ("" if none)."""

    file: str
    index: int
    language: str
    code: str
    note: str

    @property
    def id(self) -> str:
        return f"{self.file}[{self.index}]"

    @property
    def not_run_reason(self) -> str | None:
        """The reason after `not run:`, or None when the block is meant to run."""
        match = _NOT_RUN.fullmatch(self.note)
        return match["reason"].strip() if match else None

    @property
    def continues_previous(self) -> bool:
        return self.note == _CONTINUES


def code_blocks(markdown: Path, language: str = "python") -> list[DocBlock]:
    """The ```LANGUAGE blocks of a markdown file, in order."""
    file = str(markdown.resolve().relative_to(REPO))
    matches = [m for m in _FENCE.finditer(markdown.read_text()) if m["lang"] == language]
    return [
        DocBlock(file, index, language, m["code"], (m["note"] or "").strip())
        for index, m in enumerate(matches)
    ]


def documentation_files() -> list[Path]:
    """README.md and every docs/*.md: the files whose examples must run."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def python_blocks(markdown: Path) -> list[str]:
    """The ```python code blocks of a markdown file, in order (their code only)."""
    return [block.code for block in code_blocks(markdown)]


def run_block(
    code: str, namespace: dict | None = None, name: str = "doc_example"
) -> tuple[dict, str]:
    """Runs a documentation code block as written (in `namespace`, a fresh one if None); returns
    its globals and what it printed."""
    namespace = {"__name__": "doc_example"} if namespace is None else namespace
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, name, "exec"), namespace)
    return namespace, printed.getvalue()
