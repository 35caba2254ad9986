"""The errors raised for schemas we cannot enforce exactly, and JSON-pointer paths for them."""

from __future__ import annotations


class UnsupportedSchemaError(ValueError):
    """A schema keyword cannot be enforced exactly, so the schema is rejected (never weakened).

    Attributes:
        keyword: the offending keyword, e.g. "multipleOf".
        path: JSON pointer of the schema holding it, e.g. "#/properties/age".
    """

    def __init__(self, keyword: str, path: str, reason: str = ""):
        message = f"unsupported keyword {keyword!r} at {path}"
        super().__init__(f"{message}: {reason}" if reason else message)
        self.keyword = keyword
        self.path = path
        self.reason = reason


class UnsatisfiableSchemaError(UnsupportedSchemaError):
    """No JSON value satisfies the schema (e.g. `minimum: 10, maximum: 1`): nothing to generate.

    `keyword` and `path` name the first contradiction found; `reason` says what it is.
    """

    def __init__(self, keyword: str, path: str, reason: str):
        super().__init__(keyword, path, reason)
        self.args = (f"no value satisfies the schema: {reason} ({keyword!r} at {path})",)


def child_path(path: str, *tokens: object) -> str:
    """`path` extended by JSON-pointer tokens (escaping '~' and '/')."""
    escaped = (str(token).replace("~", "~0").replace("/", "~1") for token in tokens)
    return "/".join([path, *escaped])
