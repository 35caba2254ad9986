"""Resolution of `$ref` inside one schema document: JSON pointers and `$anchor` names.

Remote references (other documents) are rejected. A reference may repeat the root `$id`
before its fragment. Embedded resources (a `$id` below the root) are rejected by the keyword
check, so every fragment is relative to the root.
"""

from __future__ import annotations

import urllib.parse

from radixgen.constrained.unsupported import UnsupportedSchemaError, child_path


class RefResolver:
    """Finds the subschema a `$ref` points to, with its JSON path."""

    def __init__(self, root: object):
        self.root = root
        self.root_id = root.get("$id", "") if isinstance(root, dict) else ""
        self._anchors: dict[str, tuple[object, str]] | None = None

    def resolve(self, ref: str, ref_path: str) -> tuple[object, str]:
        """(subschema, its path) for `ref`, found at `ref_path` (for errors)."""
        base, _, fragment = ref.partition("#")
        if base and base != self.root_id:
            raise UnsupportedSchemaError("$ref", ref_path, f"remote reference {ref!r}")
        fragment = urllib.parse.unquote(fragment)
        if fragment == "" or fragment.startswith("/"):
            return self._follow_pointer(fragment, ref, ref_path)
        anchors = self._collect_anchors()
        if fragment not in anchors:
            raise ValueError(f"schema at {ref_path}: $ref {ref!r} names no $anchor")
        return anchors[fragment]

    def _follow_pointer(self, pointer: str, ref: str, ref_path: str) -> tuple[object, str]:
        node, path = self.root, "#"
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise ValueError(f"schema at {ref_path}: $ref {ref!r} points nowhere")
            path = child_path(path, token)
        return node, path

    def _collect_anchors(self) -> dict[str, tuple[object, str]]:
        if self._anchors is None:
            self._anchors = {}
            stack = [(self.root, "#")]
            while stack:
                node, path = stack.pop()
                if isinstance(node, dict):
                    for keyword in ("$anchor", "$dynamicAnchor"):
                        if isinstance(node.get(keyword), str):
                            self._anchors.setdefault(node[keyword], (node, path))
                    stack.extend((value, child_path(path, key)) for key, value in node.items())
                elif isinstance(node, list):
                    stack.extend((value, child_path(path, i)) for i, value in enumerate(node))
        return self._anchors
