"""Resolution of `$ref` inside one schema document: URIs, JSON pointers and anchors.

Every schema resource of the document is indexed by its absolute URI: the root, and each
subschema with an `$id` (draft 4: `id`), resolved against the resource around it. A `$ref` is
resolved against the base URI of the schema holding it, then looked up in that index; its
fragment is a JSON pointer inside the resource or an `$anchor`/`$dynamicAnchor` name. References
to other documents are rejected. Only schema positions are walked (not `enum`/`const` values),
so an `$id` inside data is not an identifier.
"""

from __future__ import annotations

import urllib.parse

from radixgen.constrained.schema_keywords import (
    SUBSCHEMA_KEYWORDS,
    SUBSCHEMA_LISTS,
    SUBSCHEMA_MAPS,
    Dialect,
)
from radixgen.constrained.unsupported import UnsupportedSchemaError, child_path

# Base URI of the document (never fetched, only joined against, so relative `$id`s work).
_PLACEHOLDER_BASE = "https://radixgen.invalid/root/"


class RefResolver:
    """Finds the subschema a `$ref` points to, with its JSON path."""

    def __init__(self, root: object, dialect: Dialect):
        self.root = root
        self.dialect = dialect
        self._resources: dict[str, tuple[object, str]] = {}  # absolute URI -> (schema, path)
        self._base_of_path: dict[str, str] = {}  # schema path -> its base URI
        self._anchors: dict[tuple[str, str], tuple[object, str]] = {}
        self._dynamic_anchors: dict[str, list[str]] = {}  # name -> resources declaring it
        self._index(root, "#", _PLACEHOLDER_BASE)

    def resolve(self, ref: str, ref_path: str) -> tuple[object, str]:
        """(subschema, its path) for `ref`, found at `ref_path` (for errors)."""
        target = self._join(self._base_for(ref_path), ref)
        resource_uri, _, fragment = target.partition("#")
        if resource_uri not in self._resources:
            raise UnsupportedSchemaError("$ref", ref_path, f"remote reference {ref!r}")
        fragment = urllib.parse.unquote(fragment)
        if fragment == "" or fragment.startswith("/"):
            return self._follow_pointer(resource_uri, fragment, ref, ref_path)
        if (resource_uri, fragment) not in self._anchors:
            raise ValueError(f"schema at {ref_path}: $ref {ref!r} names no $anchor")
        return self._anchors[(resource_uri, fragment)]

    def dynamic_ref_is_static(self, ref: str, ref_path: str) -> bool:
        """True when `$dynamicRef` can only ever land where `$ref` would.

        That holds when its fragment names a `$dynamicAnchor` declared in at most one resource
        of the document (every dynamic scope then offers the same target), or no dynamic anchor.
        """
        fragment = ref.partition("#")[2]
        return len(self._dynamic_anchors.get(fragment, [])) <= 1

    def _base_for(self, path: str) -> str:
        while path not in self._base_of_path and "/" in path:
            path = path.rsplit("/", 1)[0]
        return self._base_of_path.get(path, self._base_of_path["#"])

    def _join(self, base: str, ref: str) -> str:
        if base.startswith("urn:") and not ref.startswith("#") and ":" not in ref:
            raise UnsupportedSchemaError("$ref", base, f"relative reference {ref!r} to a URN")
        if ref.startswith("#") or ":" in ref.split("/")[0]:
            joined = base.partition("#")[0] + ref if ref.startswith("#") else ref
        else:
            joined = urllib.parse.urljoin(base, ref)
        resource, hash_sign, fragment = joined.partition("#")
        return resource + hash_sign + fragment if fragment else resource + "#"

    def _index(self, node: object, path: str, base: str) -> None:
        if not isinstance(node, dict):
            return
        identifier = node["$id"] if isinstance(node.get("$id"), str) else self._legacy_id(node)
        if self.dialect <= Dialect.DRAFT7 and "$ref" in node:
            identifier = None  # up to draft 7, `$ref` makes its siblings ignored, `$id` too
        if isinstance(identifier, str):
            resource, _, fragment = identifier.partition("#")
            if resource:
                base = self._join(base, resource).partition("#")[0]
                self._resources.setdefault(base, (node, path))
            if fragment and not fragment.startswith("/"):  # draft 6/7 "$id": "#name"
                self._anchors.setdefault((base, fragment), (node, path))
        if path == "#":
            self._resources.setdefault(base, (node, path))
            self._resources.setdefault(_PLACEHOLDER_BASE, (node, path))
        self._base_of_path[path] = base
        for keyword in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(keyword), str):
                self._anchors.setdefault((base, node[keyword]), (node, path))
        if isinstance(node.get("$dynamicAnchor"), str):
            self._dynamic_anchors.setdefault(node["$dynamicAnchor"], []).append(base)
        for keyword, value in node.items():
            if keyword in SUBSCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    self._index(sub, child_path(path, keyword, name), base)
            elif keyword in SUBSCHEMA_LISTS and isinstance(value, list):
                for index, sub in enumerate(value):
                    self._index(sub, child_path(path, keyword, index), base)
            elif keyword in SUBSCHEMA_KEYWORDS:
                self._index(value, child_path(path, keyword), base)

    def _legacy_id(self, node: dict) -> object:
        """Draft 4's `id`, read where the document is draft 4 or names no dialect."""
        if self.dialect <= Dialect.DRAFT4 or "$schema" not in self.root:
            return node.get("id")
        return None

    def _follow_pointer(
        self, resource_uri: str, pointer: str, ref: str, ref_path: str
    ) -> tuple[object, str]:
        node, path = self._resources[resource_uri]
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
