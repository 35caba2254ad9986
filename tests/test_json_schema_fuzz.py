"""Random schemas built from the keywords the translator writes by negation and automata.

Soundness only: whenever a random instance matches the regex of a random schema, `jsonschema`
must say it is valid (valid instances may be unmatched: keys in declared order, canonical
integers). Schemas the translator refuses are skipped, which is also allowed.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixgen.constrained import UnsupportedSchemaError, json_schema_to_regex

_SCALARS = [None, True, False, 0, 1, 2, 5, -3, 2.5, "", "a", "ab", "b", "abc"]
_LEAF_SCHEMAS = st.one_of(
    st.builds(
        lambda t: {"type": t},
        st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"]),
    ),
    st.builds(lambda v: {"const": v}, st.sampled_from(_SCALARS)),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(_SCALARS), min_size=1, max_size=3)),
    st.builds(lambda m: {"minimum": m}, st.integers(-3, 5)),
    st.builds(lambda m: {"exclusiveMaximum": m}, st.sampled_from([0, 2, 2.5])),
    st.builds(lambda n: {"maxLength": n}, st.integers(0, 3)),
    st.builds(lambda n: {"minLength": n}, st.integers(0, 3)),
    st.builds(
        lambda p: {"pattern": p},
        st.sampled_from(["^a", "b", "^(a|b)*$", "c$", "(^|b)a$", "^(?=.*b)a", "^(?!ab$)"]),
    ),
    st.builds(lambda n: {"minItems": n}, st.integers(0, 2)),
    st.builds(lambda n: {"maxItems": n}, st.integers(0, 2)),
    st.builds(
        lambda names: {"required": names},
        st.lists(st.sampled_from("abc"), min_size=1, max_size=2, unique=True),
    ),
    st.builds(lambda n: {"maxProperties": n}, st.integers(0, 2)),
    st.just({"minProperties": 1}),
    st.builds(lambda m: {"multipleOf": m}, st.sampled_from([2, 3, 0.5])),
)


def _extend(inner):
    return st.one_of(
        st.builds(lambda s: {"not": s}, inner),
        st.builds(lambda a, b: {"allOf": [a, b]}, inner, inner),
        st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
        st.builds(lambda a, b: {"oneOf": [a, b]}, inner, inner),
        st.builds(lambda c, t, e: {"if": c, "then": t, "else": e}, inner, inner, inner),
        st.builds(lambda s: {"items": s}, inner),
        st.builds(lambda s, lo: {"contains": s, "minContains": lo}, inner, st.integers(0, 2)),
        st.builds(lambda s, hi: {"contains": s, "maxContains": hi}, inner, st.integers(0, 1)),
        st.builds(lambda k, s: {"properties": {k: s}}, st.sampled_from("abc"), inner),
        st.builds(
            lambda k, s: {"patternProperties": {k: s}}, st.sampled_from(["^a", "b", "c"]), inner
        ),
        st.builds(lambda s: {"additionalProperties": s}, inner),
        st.builds(lambda k, s: {"dependentSchemas": {k: s}}, st.sampled_from("abc"), inner),
        st.builds(
            lambda k, d: {"dependentRequired": {k: [d]}},
            st.sampled_from("ab"),
            st.sampled_from("bc"),
        ),
        st.builds(lambda a, s: {**a, "unevaluatedProperties": s}, inner, inner),
        st.builds(lambda a, s: {**a, "unevaluatedItems": s}, inner, inner),
        st.builds(lambda a, b: {"prefixItems": [a, b]}, inner, inner),
        st.builds(lambda s: {"propertyNames": s}, inner),
        st.builds(lambda s: {"items": {"enum": [1, "a", None]}, "uniqueItems": True, **s}, inner),
    )


_SCHEMAS = st.recursive(_LEAF_SCHEMAS, _extend, max_leaves=4)
_VALUES = st.recursive(
    st.sampled_from(_SCALARS),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=5,
)


def check_schema(schema, values) -> None:
    try:
        regex = re.compile(json_schema_to_regex(schema, allow_undeclared_properties=True))
    except UnsupportedSchemaError:
        return
    validator = jsonschema.Draft202012Validator(schema)
    for value in values:
        if regex.fullmatch(json.dumps(value, separators=(",", ":"))):
            assert validator.is_valid(value), (schema, value)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_SCHEMAS, values=st.lists(_VALUES, min_size=5, max_size=10))
def test_random_schemas_never_match_an_invalid_instance(schema, values):
    check_schema(schema, values)
