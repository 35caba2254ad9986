"""Expansion of a schema's applicators into alternatives: conjunctions of applicator-free pieces.

`allOf` multiplies alternatives, `anyOf` unites them, `$ref` follows the resolver. Keywords that
test one schema against another are written with exact negation (`schema_negation`):

- `not: S` is the conjunction over S's alternatives of "some keyword of it fails";
- `oneOf` is `anyOf` where the branches provably share no instance, otherwise each branch
  conjoined with the negation of the others;
- `if`/`then`/`else` is `(if and then) or (not if and else)`;
- `dependentRequired`/`dependentSchemas` (and draft-4 `dependencies`) are "the key is absent, or
  it is present and the dependency holds";
- `unevaluatedProperties`/`unevaluatedItems` become additional properties/items relative to
  the names and prefixes that the pieces of each alternative evaluate (only the schema's own
  subtree, and never pieces built by negation, whose keywords produce no annotations).
"""

from __future__ import annotations

import json

from radixgen.constrained.schema_disjoint import provably_disjoint
from radixgen.constrained.schema_keywords import (
    Dialect,
    RefDepths,
    check_keywords,
    effective_keywords,
    local_piece,
)
from radixgen.constrained.schema_merge import (
    ARRAY_KEYWORDS,
    NEGATION,
    MergeConflict,
    MergedSchema,
    Part,
    merge_pieces,
)
from radixgen.constrained.schema_negation import Negated, negate_piece
from radixgen.constrained.schema_refs import RefResolver
from radixgen.constrained.unsupported import UnsupportedSchemaError, child_path

# An expansion with more alternatives than this is rejected, not built.
MAX_ALTERNATIVES = 64

# One alternative: the applicator-free pieces that must all hold, and the $ref expansion counts.
Alternative = tuple[tuple[Part, ...], RefDepths]


def merge_alternative(pieces: tuple[Part, ...]) -> MergedSchema:
    """The conjunction of `pieces`, with merge conflicts reported as unsupported keywords."""
    try:
        return merge_pieces(list(pieces))
    except MergeConflict as conflict:
        raise UnsupportedSchemaError(conflict.keyword, conflict.path, str(conflict)) from None


class SchemaExpander:
    """Expands subschemas of one document into alternatives (see the module docstring)."""

    def __init__(
        self, root: object, dialect: Dialect, *, max_recursion_depth: int, assert_formats: bool
    ):
        self.root = root
        self.dialect = dialect
        self.max_recursion_depth = max_recursion_depth
        self.assert_formats = assert_formats
        self.refs = RefResolver(root, dialect)
        # An `if` alone asserts nothing, but its annotations count for unevaluated*.
        self.tracks_annotations = '"unevaluated' in json.dumps(root)

    def expand_all(self, parts: tuple[Part, ...], ref_depths: RefDepths) -> list[Alternative]:
        """Alternatives whose union is exactly the instances satisfying every part."""
        alternatives: list[Alternative] = [((), ref_depths)]
        for schema, path in parts:
            alternatives = self.product(alternatives, self.expand(schema, path, ref_depths), path)
        return alternatives

    def expand(self, schema: object, path: str, ref_depths: RefDepths) -> list[Alternative]:
        if isinstance(schema, Negated):
            return self.negate(schema.schema, schema.path, ref_depths)
        if schema is True:
            return [((), ref_depths)]
        if schema is False:
            return []
        check_keywords(schema, path)
        schema = effective_keywords(schema, self.dialect)
        piece = local_piece(schema, path, self.assert_formats)
        alternatives: list[Alternative] = [(((piece, path),), ref_depths)]
        for keyword in ("$ref", "$dynamicRef"):
            if keyword in schema:
                alternatives = self._with_ref(alternatives, schema[keyword], keyword, path)
        for index, sub in enumerate(schema.get("allOf", [])):
            sub_alternatives = self.expand(sub, f"{path}/allOf/{index}", ref_depths)
            alternatives = self.product(alternatives, sub_alternatives, path)
        if "anyOf" in schema:
            union = []
            for index, sub in enumerate(schema["anyOf"]):
                union += self.expand(sub, f"{path}/anyOf/{index}", ref_depths)
            alternatives = self.product(alternatives, union, f"{path}/anyOf")
        if "oneOf" in schema:
            alternatives = self._one_of(schema["oneOf"], alternatives, path, ref_depths)
        if "not" in schema:
            negated = self.negate(schema["not"], f"{path}/not", ref_depths)
            alternatives = self.product(alternatives, negated, f"{path}/not")
        if "if" in schema and ("then" in schema or "else" in schema or self.tracks_annotations):
            alternatives = self.product(alternatives, self._if(schema, path, ref_depths), path)
        for dependency in self._dependencies(schema, path, ref_depths):
            alternatives = self.product(alternatives, dependency, path)
        if "unevaluatedProperties" in schema or "unevaluatedItems" in schema:
            alternatives = [self._unevaluated(schema, path, alt) for alt in alternatives]
        return alternatives

    def negate(self, schema: object, path: str, ref_depths: RefDepths) -> list[Alternative]:
        """Alternatives whose union is exactly the instances failing `schema`."""
        result: list[Alternative] = [((), ref_depths)]
        for pieces, depths in self.expand(schema, path, ref_depths):
            failures = [
                (((failure, piece_path),), depths)
                for piece, piece_path in pieces
                for failure in negate_piece(piece, piece_path)
            ]
            result = self.product(result, failures, path, keyword="not")
            if not result:
                break
        return result

    def product(
        self, left: list[Alternative], right: list[Alternative], path: str, keyword="anyOf"
    ) -> list[Alternative]:
        if len(left) * len(right) > MAX_ALTERNATIVES:
            reason = f"more than {MAX_ALTERNATIVES} alternatives after expansion"
            raise UnsupportedSchemaError(keyword, path, reason)
        result = []
        for left_pieces, left_depths in left:
            for right_pieces, right_depths in right:
                depths = dict(left_depths)
                for target, count in right_depths:
                    depths[target] = max(depths.get(target, 0), count)
                result.append((left_pieces + right_pieces, tuple(sorted(depths.items()))))
        return result

    def _with_ref(
        self, alternatives: list[Alternative], ref: object, keyword: str, path: str
    ) -> list[Alternative]:
        ref_path = f"{path}/{keyword}"
        if not isinstance(ref, str):
            raise ValueError(f"schema at {path}: {keyword!r} must be a string")
        if keyword == "$dynamicRef" and not self.refs.dynamic_ref_is_static(ref, ref_path):
            reason = "its target depends on the dynamic scope"
            raise UnsupportedSchemaError(keyword, path, reason)
        target, target_path = self.refs.resolve(ref, ref_path)
        result = []
        for pieces, ref_depths in alternatives:
            count = dict(ref_depths).get(target_path, 0)
            if count >= self.max_recursion_depth:
                continue  # recursion cut: deeper instances are not produced
            deeper = tuple(sorted({**dict(ref_depths), target_path: count + 1}.items()))
            target_alternatives = self.expand(target, target_path, deeper)
            result += self.product([(pieces, ref_depths)], target_alternatives, path)
        return result

    def _one_of(
        self, branches: list, base: list[Alternative], path: str, ref_depths: RefDepths
    ) -> list[Alternative]:
        """Exactly one branch holds: each branch, and the negation of those it may overlap."""
        paths = [f"{path}/oneOf/{index}" for index in range(len(branches))]
        expanded = [
            self.expand(sub, sub_path, ref_depths)
            for sub, sub_path in zip(branches, paths, strict=True)
        ]
        merged_branches = [[merge_alternative(pieces) for pieces, _ in alts] for alts in expanded]
        union: list[Alternative] = []
        for index, alternatives in enumerate(expanded):
            for other, other_merged in enumerate(merged_branches):
                if other == index or all(
                    provably_disjoint(left, right)
                    for left in merged_branches[index]
                    for right in other_merged
                ):
                    continue
                negated = self.negate(branches[other], paths[other], ref_depths)
                alternatives = self.product(alternatives, negated, path, keyword="oneOf")
            union += alternatives
        return self.product(base, union, path, keyword="oneOf")

    def _if(self, schema: dict, path: str, ref_depths: RefDepths) -> list[Alternative]:
        condition = self.expand(schema["if"], f"{path}/if", ref_depths)
        then = self.expand(schema.get("then", True), f"{path}/then", ref_depths)
        otherwise = self.expand(schema.get("else", True), f"{path}/else", ref_depths)
        failed = self.negate(schema["if"], f"{path}/if", ref_depths)
        return self.product(condition, then, path, keyword="if") + self.product(
            failed, otherwise, path, keyword="if"
        )

    def _dependencies(
        self, schema: dict, path: str, ref_depths: RefDepths
    ) -> list[list[Alternative]]:
        """One disjunction per dependency: the key absent, or present with what it requires."""
        entries = []
        for keyword in ("dependentRequired", "dependentSchemas", "dependencies"):
            for name, dependency in schema.get(keyword, {}).items():
                entries.append((child_path(path, keyword, name), name, dependency))
        result = []
        for dependency_path, name, dependency in entries:
            absent = (({"properties": {name: False}, NEGATION: True}, dependency_path),)
            present = (({"required": [name]}, dependency_path),)
            if isinstance(dependency, list):
                if not all(isinstance(other, str) for other in dependency):
                    raise ValueError(f"schema at {dependency_path} must be an array of strings")
                # Dependencies first: the natural order ("b", then "a" that needs it).
                present = (({"required": [*dependency, name]}, dependency_path),)
                holds = [(present, ref_depths)]
            else:
                holds = self.product(
                    [(present, ref_depths)],
                    self.expand(dependency, dependency_path, ref_depths),
                    dependency_path,
                )
            result.append([(absent, ref_depths), *holds])
        return result

    def _unevaluated(self, schema: dict, path: str, alternative: Alternative) -> Alternative:
        """The alternative plus additional properties/items for what its pieces leave unevaluated."""
        pieces, ref_depths = alternative
        annotating = [piece for piece, _ in pieces if NEGATION not in piece]
        extra: list[Part] = []
        if "unevaluatedProperties" in schema:
            if not any("additionalProperties" in piece for piece in annotating):
                names = {name: True for piece in annotating for name in piece.get("properties", {})}
                patterns = {
                    pattern: True
                    for piece in annotating
                    for pattern in piece.get("patternProperties", {})
                }
                rest = schema["unevaluatedProperties"]
                piece = {"properties": names, "additionalProperties": rest}
                if patterns:
                    piece["patternProperties"] = patterns
                extra.append((piece, path))
        if "unevaluatedItems" in schema:
            if any("contains" in piece for piece in annotating):
                raise UnsupportedSchemaError("unevaluatedItems", path, "next to contains")
            if not any("items" in piece for piece in annotating):
                evaluated = max((len(p.get("prefixItems", [])) for p in annotating), default=0)
                piece = {
                    "prefixItems": [True] * evaluated,
                    "items": schema["unevaluatedItems"],
                    ARRAY_KEYWORDS: ("prefixItems", "unevaluatedItems"),
                }
                extra.append((piece, path))
        return pieces + tuple(extra), ref_depths
