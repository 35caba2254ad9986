"""json_schema_to_regex: every accepted keyword enforced exactly, the rest rejected by name."""

from __future__ import annotations

import functools
import itertools
import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from radixgen.constrained import (
    UnsatisfiableSchemaError,
    UnsupportedSchemaError,
    json_schema_to_regex,
)


@functools.lru_cache(maxsize=256)
def _compiled(schema_text: str, options_text: str) -> re.Pattern:
    return re.compile(json_schema_to_regex(json.loads(schema_text), **json.loads(options_text)))


def matcher(schema: object, **options) -> re.Pattern:
    return _compiled(json.dumps(schema, sort_keys=False), json.dumps(options))


def compact(value: object, ensure_ascii: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii)


def assert_language(schema, valid=(), invalid=(), **options):
    pattern = matcher(schema, **options)
    for value in valid:
        assert pattern.fullmatch(compact(value)), f"{compact(value)} should match {schema}"
    for value in invalid:
        for spelling in (compact(value), compact(value, ensure_ascii=True)):
            assert not pattern.fullmatch(spelling), f"{spelling} should not match {schema}"


# ---- numbers ----


@settings(max_examples=150, deadline=None)
@given(
    low=st.one_of(st.none(), st.integers(-1200, 1200)),
    high=st.one_of(st.none(), st.integers(-1200, 1200)),
    exclusive=st.booleans(),
    values=st.lists(st.integers(-2000, 2000), min_size=20, max_size=40),
)
def test_integer_bounds_are_exact(low, high, exclusive, values):
    schema = {"type": "integer"}
    if low is not None:
        schema["exclusiveMinimum" if exclusive else "minimum"] = low
    if high is not None:
        schema["maximum"] = high
    if low is not None and high is not None and high < low + exclusive:
        with pytest.raises(UnsupportedSchemaError):
            json_schema_to_regex(schema)
        return
    pattern = matcher(schema)
    for value in values + [low or 0, high or 0, (low or 0) + 1, (high or 0) - 1]:
        assert bool(pattern.fullmatch(str(value))) == jsonschema.Draft202012Validator(
            schema
        ).is_valid(value), (schema, value)


def test_integer_spelling_is_canonical():
    assert_language(
        {"type": "integer", "minimum": -5, "maximum": 5},
        valid=[0, -5, 5, -1],
        invalid=[6, -6, 1.5, "1", True, None],
    )
    pattern = matcher({"type": "integer"})
    for text in ["-0", "01", "+1", "1e3", "", "-"]:
        assert not pattern.fullmatch(text)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 5, "minimum": 0},
        {"type": "integer", "multipleOf": 4},
        {"type": "integer", "multipleOf": 7, "minimum": -30, "exclusiveMaximum": 50},
        {"type": "number", "multipleOf": 3, "minimum": -9, "maximum": 40},
        {"type": "integer", "multipleOf": 2.5, "minimum": 0, "maximum": 100},
        {"allOf": [{"multipleOf": 4}, {"multipleOf": 10}], "type": "integer"},
    ],
)
def test_multiple_of_integers(schema):
    pattern = matcher(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for value in range(-120, 1200):
        assert bool(pattern.fullmatch(str(value))) == validator.is_valid(value), (schema, value)


def test_multiple_of_any_small_divisor_from_the_remainder_automaton():
    assert_language({"type": "integer", "multipleOf": 3}, [0, 3, -9, 123456], [1, -4, 100])
    bounded = {"type": "integer", "multipleOf": 6, "minimum": -20, "exclusiveMaximum": 2000}
    assert_language(bounded, [-18, 0, 1998], [-24, 2004, 7])


def test_fractional_multiple_of_on_numbers():
    cents = {"type": "number", "multipleOf": 0.01, "minimum": 0}
    assert_language(cents, [0, 1, 19.99, 2.5, 100.1], [1.005, -0.01, 0.001])
    quarters = {"type": "number", "multipleOf": 0.25, "exclusiveMaximum": 1}
    assert_language(quarters, [0.75, -3.25, 0, -7], [1, 1.25, 0.3, 0.1])
    halves = {"type": "number", "multipleOf": 0.5, "minimum": 5, "maximum": 7}
    assert_language(halves, [5, 5.5, 6, 7], [4.5, 7.5, 5.25])


def test_fractional_integer_bounds_round_inwards():
    assert_language({"type": "integer", "minimum": 1.5, "exclusiveMaximum": 4.0}, [2, 3], [1, 4])


def test_number_bounds_with_fractions():
    schema = {"type": "number", "exclusiveMinimum": -1, "maximum": 2}
    pattern = matcher(schema)
    for text, ok in [
        ("-1", False), ("-0.999", True), ("-1.0", False), ("0", True), ("2", True),
        ("2.000", True), ("2.0001", False), ("1.9999", True), ("-0", False), ("3", False),
    ]:  # fmt: skip
        assert bool(pattern.fullmatch(text)) == ok, text
    assert_language({"type": "number"}, [1, -1.5, 1e30, 0.25], ["1", None])


@settings(max_examples=100, deadline=None)
@given(
    low=st.decimals(-30, 30, places=3),
    high=st.decimals(-30, 30, places=3),
    exclusive=st.booleans(),
    values=st.lists(st.decimals(-40, 40, places=4), min_size=10, max_size=20),
)
def test_fractional_number_bounds_are_exact(low, high, exclusive, values):
    schema = {"type": "number", "minimum": float(low), "exclusiveMaximum": float(high)}
    if exclusive:
        schema = {"type": "number", "exclusiveMinimum": float(low), "maximum": float(high)}
    if high <= low:
        return  # empty ranges raise (tested elsewhere)
    pattern = matcher(schema)
    for value in values + [low, high]:
        text = format(value, "f")
        if value == 0 and text.startswith("-"):
            continue  # "-0.0" is never produced (0 is, as "0")
        expected = jsonschema.Draft202012Validator(schema).is_valid(float(text))
        assert bool(pattern.fullmatch(text)) == expected, (schema, text)


# ---- strings ----


def test_string_escapes_and_lengths_count_code_points():
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    pattern = matcher(schema)
    for value in ["ab", "a\n", 'q"', "\\\\", "é😀", "\U0001f600\U0001f600\U0001f600"]:
        assert pattern.fullmatch(compact(value)), value
        assert pattern.fullmatch(compact(value, ensure_ascii=True)), value
    for text in ['"a"', '"abcd"', '"\\ud83d"', '"\\ud83dx"', '"\n\t"', '"\\x"', '"\\u12"']:
        assert not pattern.fullmatch(text), text
    assert pattern.fullmatch('"\\u00e9\\/"')


@pytest.mark.parametrize(
    ("pattern_text", "min_length", "max_length"),
    [
        ("^[a-z]+$", 0, 3),
        ("b", 0, 3),
        ("^a*b?$", 1, 2),
        ("x|^y", 2, 3),
        ("^(ab)+$", 3, 6),
        ("[0-9]{2}", 0, None),
        ("^\\d+\\.\\w?$", 2, 4),
        ('^[^"]\\s.$', 0, None),
        ("^(?:a|bc)*$", 0, None),
    ],
)
def test_pattern_with_lengths_matches_search_semantics(pattern_text, min_length, max_length):
    schema = {"type": "string", "pattern": pattern_text, "minLength": min_length}
    if max_length is not None:
        schema["maxLength"] = max_length
    pattern = matcher(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for length in range(0, 6):
        for chars in itertools.product('ab1."x y', repeat=length):
            value = "".join(chars)
            expected = validator.is_valid(value)
            assert bool(pattern.fullmatch(compact(value))) == expected, (schema, value)


def test_lookaheads_after_a_leading_caret_are_intersections():
    password = {"type": "string", "pattern": "^(?=.*[0-9])(?=.*[a-z]).{8,}$"}
    assert_language(password, ["abcdefg1", "1234567x"], ["abcdefgh", "12345678", "a1"])
    slug = {"type": "string", "pattern": "^(?=.{3,8}$)[a-z]+(-[a-z]+)*$"}
    assert_language(slug, ["abc", "ab-cd", "a-b-c-d"], ["ab", "abcdefghi", "ab-"])
    assert_language({"pattern": "^(?!admin$)[a-z]+$"}, ["admins", "bob"], ["admin", "Bob"])
    with pytest.raises(UnsupportedSchemaError, match="right after a leading"):
        json_schema_to_regex({"pattern": "a(?=b)"})


def test_anchors_mid_pattern():
    domain = {"type": "string", "pattern": "(^|\\.)example\\.com$"}
    assert_language(domain, ["example.com", "a.example.com"], ["aexample.com", "example.com.x"])
    assert_language({"pattern": "x($|y)"}, ["x", "xy", "axyz"], ["xz", "y"])
    assert_language({"pattern": "a$b"}, [1, None], ["ab", "a", ""])  # no string matches
    with pytest.raises(UnsatisfiableSchemaError):
        json_schema_to_regex({"type": "string", "pattern": "a$b"})


def test_pattern_outside_the_lengths_leaves_other_types():
    assert_language({"pattern": "^abc$", "maxLength": 2}, [1, None, [1]], ["abc", "ab"])


def test_variable_repetition_with_length_gets_a_capped_subset():
    # No exact split: repetitions are capped so that no match exceeds maxLength.
    schema = {"type": "string", "pattern": "^(a|bc)*$", "maxLength": 4}
    assert_language(schema, ["", "a", "bc", "aa"], ["abcbc", "bcbca", "b", "x"])
    name = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    kubernetes_name = {"type": "string", "pattern": name, "maxLength": 253}
    assert_language(kubernetes_name, ["web", "my-app.prod", "a.b.c"], ["-a", "A", "a" * 254])
    with pytest.raises(UnsupportedSchemaError, match="'pattern' at #"):
        json_schema_to_regex(
            {"type": "string", "pattern": "^(a|bc)*$", "minLength": 3, "maxLength": 3}
        )


@pytest.mark.parametrize("pattern_text", ["(a)\\1", "a(?=b)", "\\bword", "\\p{L}"])
def test_unsupported_pattern_syntax_is_rejected(pattern_text):
    with pytest.raises(UnsupportedSchemaError) as error:
        json_schema_to_regex({"properties": {"p": {"pattern": pattern_text}}})
    assert (error.value.keyword, error.value.path) == ("pattern", "#/properties/p")


@pytest.mark.parametrize(
    ("name", "valid", "invalid"),
    [
        ("date", ["2024-02-29", "2000-02-29", "1999-12-31"], ["1900-02-29", "2023-02-29", "2021-04-31", "2021-1-01"]),
        ("time", ["08:30:06Z", "23:59:59.5+05:30", "00:00:00z"], ["24:00:00Z", "08:30:06", "08:60:00Z", "22:59:60Z", "23:59:60+01:00"]),
        ("date-time", ["1963-06-19T08:30:06.283185Z", "2020-01-01t00:00:00-01:00"], ["1963-06-19 08:30:06Z", "1963-13-19T08:30:06Z"]),
        ("uuid", ["2eb8aa08-aa98-11ea-b4aa-73b441d16380", "2EB8AA08-AA98-11EA-B4AA-73B441D16380"], ["2eb8aa08-aa98-11ea-b4aa-73b441d1638", "2eb8aa08aa9811eab4aa73b441d16380"]),
        ("email", ["joe.bloggs@example.com", "te~st@example.com", "a@b"], ["joe..bloggs@example.com", ".a@example.com", "a@-b.com", "2962"]),
        ("ipv4", ["192.168.0.1", "0.0.0.0", "255.255.255.255"], ["256.0.0.1", "087.10.0.1", "1.2.3", "1.2.3.4.5"]),
        ("uri", ["http://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c"], ["//foo.bar/", "/abc", "abc", "http:// x.com", "bar,baz:foo"]),
        ("hostname", ["example.com", "a-b.c", "a--b.com", "a" * 63 + ".com"], ["-a.com", "a..b", "xn--X", "ab--c", "a_b.com", "a" * 64, "a" * 63 + "." + "a" * 63]),
        # Leap seconds: 23:59:60 in UTC, whatever the offset (minutes 00, 30, 45 written).
        ("time", ["23:59:60Z", "01:29:60+01:30", "15:59:60-08:00", "00:29:60-23:30", "05:44:60+05:45"], ["23:59:60+01:00", "23:59:60-00:30", "22:59:60Z"]),
        ("date-time", ["1998-12-31T23:59:60Z", "1998-12-31T23:59:60.5-00:00"], ["1998-12-31T23:58:60Z", "2016-12-31T24:59:60+01:00", "1998-12-31T23:59:60+01:00"]),
        # U-labels: at most 8 PVALID characters (Hangul, Greek, CJK), so the A-label fits.
        ("idn-hostname", ["실례.테스트", "a。b", "a．b", "a｡b", "δοκιμή.com", "例子.com"], ["παράδειγμα.com", "〮실례.테스트", "。example", "example．", "ü" * 60, "실례실례실례실례실", "Ü.com", "xn--7a", "a..b"]),
        ("idn-email", ["δοκιμή@example.com", '"δοκιμή"@example.com', "\x85@example.com", "𝕏@example.com", "a" * 64 + "@example.com", "실례@실례.테스트"], ["user＠example.com", "a" * 65 + "@example.com", "δ" * 17 + "@example.com", ".δ@example.com"]),
        ("regex", ["([abc])+\\s+$", "[]", "[^]", "\\cA", "(?<=a+)b", "(?:a|b)*c"], ["^(abc]", "\\a", "(?P<name>x)", "(?i)abc", "(?=a)*", "a**"]),
        ("uri-template", ["a😀b", "{x,y}"], ["a b", "{}"]),
        ("iri", ["http://ƒøø.ßår/?q=\U000f0000"], ["http://x/#\U000f0000"]),
    ],
)  # fmt: skip
def test_formats(name, valid, invalid):
    assert_language({"type": "string", "format": name}, valid, invalid)


def test_format_with_length_and_unknown_format():
    assert_language({"format": "ipv4", "maxLength": 7}, ["1.2.3.4", 5], ["10.2.3.4"])
    # pydantic's HttpUrl: too many free parts for an exact split, so repetitions get a cap.
    url = {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083}
    long_url = "http://example.com/" + "a/" * 1100
    assert_language(url, ["https://example.com/a/b?c=d#e", "urn:x"], [long_url, ""])
    # An unknown format is an annotation (JSON Schema's rule): any string.
    assert_language({"type": "string", "format": "int64"}, ["x", ""], [1])
    assert_language({"type": "string", "format": ["not", "a", "name"]}, ["x"], [1])


def test_a_cached_format_keeps_its_language_and_each_schemas_error_path():
    # A format's regex is translated once per (format, lengths) and shared by every schema
    # (email's parse and escape took ~17 ms per never-seen schema).
    for name in ("a", "b"):
        schema = {"properties": {name: {"type": "string", "format": "email"}}, "required": [name]}
        assert_language(schema, [{name: "joe@example.com"}], [{name: "joe..x@example.com"}])
        too_short = {"type": "string", "format": "email", "maxLength": 10}
        with pytest.raises(UnsupportedSchemaError, match=f"'format' at #/properties/{name}:"):
            json_schema_to_regex({"properties": {name: too_short}, "required": [name]})


# ---- objects ----


def test_optional_properties_in_any_subset_in_declared_order():
    properties = {name: {"type": "integer"} for name in "abcd"}
    schema = {"type": "object", "properties": properties, "required": ["c"]}
    pattern = matcher(schema)
    for mask in range(16):
        value = {name: index for index, name in enumerate("abcd") if mask >> index & 1}
        assert bool(pattern.fullmatch(compact(value))) == ("c" in value), value
    assert not pattern.fullmatch('{"c":1,"a":1}')  # keys come in declared order
    assert not pattern.fullmatch('{"c":1,"e":1}')  # undeclared keys are not produced...
    extras = matcher(schema, allow_undeclared_properties=True)  # ...unless asked for
    assert extras.fullmatch('{"c":1,"e":[1,{"x":null}]}')


def test_additional_properties_false_schema_and_true():
    base = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert_language({**base, "additionalProperties": False}, [{}, {"a": "x"}], [{"b": 1}])
    assert_language(
        {**base, "additionalProperties": {"type": "integer"}},
        [{"a": "x", "b": 1, "c": 2}, {"zz": 3}, {"aa": 1}],
        [{"b": "x"}, {"a": 1}],
    )
    assert_language({**base, "additionalProperties": True}, [{"b": [1]}, {"a": "", "": {}}], [])
    # "a" spelled with an escape is still "a": it must obey a's schema, not the extras'.
    pattern = matcher({**base, "additionalProperties": {"type": "integer"}})
    assert not pattern.fullmatch('{"\\u0061":1}')


def test_keys_needing_escapes_and_required_undeclared():
    schema = {"properties": {'q"k\\': {"const": 1}}, "required": ['q"k\\', "z"]}
    assert_language(schema, [{'q"k\\': 1, "z": None}], [{'q"k\\': 1}, {"z": 1}])


def test_unevaluated_without_in_place_applicators_is_additional():
    schema = {"properties": {"a": {}}, "unevaluatedProperties": {"type": "integer"}}
    assert_language(schema, [{"a": "x", "b": 1}], [{"b": "x"}])
    items = {"prefixItems": [{"type": "string"}], "unevaluatedItems": False}
    assert_language(items, [[], ["a"]], [["a", "b"]])


def test_property_names():
    schema = {"propertyNames": {"pattern": "^[a-z]+$", "maxLength": 2}, "additionalProperties": {}}
    assert_language({"type": "object", **schema}, [{}, {"ab": 1, "c": [2]}], [{"abc": 1}, {"A": 1}])
    literal_keys = {"type": "object", "propertyNames": {"enum": ["x", "y"]}}
    assert_language(
        {**literal_keys, "additionalProperties": {"type": "integer"}}, [{"x": 1}], [{"z": 1}]
    )
    declared = {"properties": {"ok": {}, "Bad": {}}, "propertyNames": {"pattern": "^[a-z]"}}
    assert_language(declared, [{"ok": 1}], [{"Bad": 1}])


def test_one_pattern_property():
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^k[0-9]$": {"type": "boolean"}},
        "additionalProperties": False,
    }
    assert_language(schema, [{"id": 1, "k1": True, "k2": False}, {}], [{"k1": 1}, {"kk": True}])


def test_several_pattern_properties_and_additional_properties():
    schema = {
        "properties": {"id": {"type": "integer"}, "x-ok": {}},
        "patternProperties": {"^x-": {"type": "string"}, "^[a-z-]+$": {"maxLength": 2}},
        "additionalProperties": {"type": "boolean"},
    }
    valid = [{"id": 1}, {"x-a": "s"}, {"ab": "s"}, {"Q": True}, {"id": 1, "x-y": "a", "Q": False}]
    valid.append({"x-ok": "ab"})  # a declared name matching patterns takes their schemas too
    invalid = [{"x-a": 1}, {"Q": 1}, {"x-ab": "abc"}, {"x-ok": 1}, {"x-ok": "abc"}, {"id": "1"}]
    assert_language(schema, valid, invalid)


def test_min_max_properties_in_their_exact_forms():
    implied = {"properties": {"a": {}}, "required": ["a"], "minProperties": 1}
    assert_language(implied, [{"a": 1}], [{}])
    assert_language({"minProperties": 1}, [{"x": 1}, {"x": 1, "y": 2}, 3], [{}])
    assert_language({"maxProperties": 2}, [{}, {"x": 1, "y": 2}], [{"x": 1, "y": 2, "z": 3}])
    assert_language({"maxProperties": 0, "properties": {"a": {}}}, [{}, "x"], [{"a": 1}])
    # Found by the schema fuzz test: an empty object is not one with at least one member.
    not_one_of = {"not": {"oneOf": [{"type": "null"}, {"maxProperties": 0}]}}
    assert_language(not_one_of, [None, {"a": 1}], [{}, 1, "x"], allow_undeclared_properties=True)
    closed = {"properties": {"a": {}, "b": {}}, "additionalProperties": False}
    assert_language({**closed, "minProperties": 1}, [{"a": 1}, {"b": 2}, {"a": 1, "b": 2}], [{}])
    one_of_two = {**closed, "maxProperties": 1}
    assert_language(one_of_two, [{}, {"a": 1}, {"b": 2}], [{"a": 1, "b": 2}])
    with pytest.raises(UnsupportedSchemaError, match="'maxProperties' at #"):
        json_schema_to_regex(
            {"properties": {"a": {}}, "additionalProperties": {}, "maxProperties": 1}
        )
    with pytest.raises(UnsupportedSchemaError, match="'minProperties' at #"):
        json_schema_to_regex({"type": "object", "minProperties": 2})


# ---- arrays ----


def test_prefix_items_items_and_counts():
    schema = {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "null"}],
        "items": {"type": "integer"},
        "minItems": 1,
        "maxItems": 4,
    }
    assert_language(
        schema,
        [["a"], ["a", None], ["a", None, 1, 2]],
        [[], [1], ["a", None, 1, 2, 3], ["a", "b"], ["a", None, "x"]],
    )
    closed = {"prefixItems": [{"type": "integer"}], "items": False}
    assert_language(closed, [[], [1]], [[1, 2], ["a"]])
    assert_language({"items": {"type": "boolean"}, "minItems": 2}, [[True, False], 3], [[True]])


def test_unique_items_when_trivial_or_finitely_many_values():
    assert_language({"uniqueItems": True, "maxItems": 1}, [[], [1]], [[1, 1]])
    enum_set = {"items": {"enum": ["a", 1, 1.0, None]}, "uniqueItems": True, "minItems": 1}
    assert_language(enum_set, [["a"], ["a", 1, None], [None]], [[], ["a", "a"], [1, 1.0], [1, "a"]])
    assert_language(
        {"items": {"type": "boolean"}, "uniqueItems": True}, [[], [True, False]], [[True, True]]
    )
    with pytest.raises(UnsupportedSchemaError, match="'uniqueItems' at #/items"):
        json_schema_to_regex({"items": {"type": "array", "uniqueItems": True}})
    # Counted sets (pydantic conset(Enum, min_length=2, max_length=3)): each choice written out.
    counted = {"items": {"enum": ["a", "b", "c", "d"]}, "uniqueItems": True}
    counted.update(minItems=2, maxItems=3)
    assert_language(
        counted, [["a", "b"], ["b", "c", "d"]], [["a"], ["a", "a"], ["a", "b", "c", "d"]]
    )
    with pytest.raises(UnsupportedSchemaError, match="'uniqueItems' at #: with minItems > 1"):
        json_schema_to_regex(
            {"items": {"enum": list(range(9))}, "uniqueItems": True, "minItems": 2}
        )


# ---- enum, const, combinators ----


def test_enum_and_const_filtered_by_other_keywords():
    schema = {"enum": [1, "a", None, {"x": [1, 2]}, 7], "type": ["integer", "object"], "maximum": 5}
    assert_language(schema, [1, {"x": [1, 2]}], ["a", None, 7, 2])
    assert_language({"const": 2.0}, [2, 2.0], [3])
    assert_language({"type": "integer", "enum": [2.0, 2.5]}, [2, 2.0], [2.5])
    with pytest.raises(UnsatisfiableSchemaError, match="no value satisfies.*'enum' at #"):
        json_schema_to_regex({"const": "a", "type": "integer"})


def test_any_of_one_of_all_of():
    assert_language(
        {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "null"}]}, ["a", None], ["ab", 1]
    )
    assert_language(
        {"oneOf": [{"type": "integer", "maximum": 0}, {"type": "integer", "minimum": 1}]},
        [0, 1],
        [0.5],
    )
    assert_language(
        {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 10}, {"exclusiveMaximum": 8}]},
        [0, 7],
        [8, -1, "a"],
    )
    # Overlapping branches: each branch and the negation of the other.
    overlapping = {"oneOf": [{"type": "integer"}, {"minimum": 2}]}
    assert_language(overlapping, [1, -3, 2.5, "x", None], [2, 3, 7])
    # Two patterns: both languages at once (an automaton product).
    assert_language({"allOf": [{"pattern": "a"}, {"pattern": "b"}]}, ["ab", "xbya", 1], ["a", "b"])
    with pytest.raises(UnsupportedSchemaError, match="'format' at #/allOf/1"):
        json_schema_to_regex({"allOf": [{"format": "date"}, {"format": "uuid"}]})


def test_all_of_merges_properties_and_additional_properties():
    schema = {
        "allOf": [
            {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
            {"properties": {"a": {"minimum": 3}, "b": {"type": "string"}}},
        ]
    }
    assert_language(schema, [{"a": 3}, {}], [{"a": 2}, {"b": "x"}, {"a": 3, "b": "x"}])


def test_nullable_types():
    assert_language({"type": ["string", "null"], "maxLength": 1}, ["", "a", None], ["ab", 0])
    assert_language({"anyOf": [{"type": "integer"}, {"type": "null"}]}, [1, None], ["x"])


def test_type_only_not():
    assert_language({"not": {"type": ["string", "null"]}}, [1, 2.5, [], {}, True], ["a", None])
    assert_language({"type": ["integer", "null"], "not": {"type": "null"}}, [1], [None])
    assert_language({"items": {"not": {}}}, [[]], [[1]])


def test_typeless_schema_infers_allowed_types():
    assert_language({"minLength": 2}, ["ab", 1, None, [1], {"k": 1}], ["a"])
    # Any value: containers nest `any_value_depth` levels (2 by default), typed or not.
    deep = {"a": [1, {"b": True}]}
    assert_language({}, [1, "x", None, [], {"a": [1, 2]}, [[3], {}]], [])
    assert not matcher({}).fullmatch(compact(deep))
    assert not matcher({"type": "object"}).fullmatch(compact(deep))
    assert_language({}, [deep], [], any_value_depth=3)
    assert_language({"type": "object"}, [deep], [], any_value_depth=3)
    assert_language(True, [1], [])


# ---- $ref and recursion ----


def test_recursive_ref_to_configurable_depth():
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                "required": ["v"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    chain = {"v": 0}
    for depth in range(1, 5):
        chain = {"v": depth, "next": chain}
        assert bool(matcher(schema, max_recursion_depth=4).fullmatch(compact(chain))) == (depth < 4)
    assert not matcher(schema).fullmatch(compact({"v": 1, "next": {}}))
    anchored = {"$defs": {"x": {"$anchor": "pos", "minimum": 1}}, "items": {"$ref": "#pos"}}
    assert_language(anchored, [[1, 2]], [[0]])
    with pytest.raises(UnsupportedSchemaError, match="'\\$ref' at #"):
        json_schema_to_regex({"$ref": "http://example.com/other.json"})


# ---- inputs, options, dialect ----


def test_pydantic_model_and_json_string_inputs():
    from typing import Literal, Union

    from pydantic import BaseModel, Field

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int = Field(ge=0, le=9)

    class Dog(BaseModel):
        kind: Literal["dog"]
        name: str | None = None

    class Pet(BaseModel):
        pet: Union[Cat, Dog] = Field(discriminator="kind")
        tags: list[str] = []

    pattern = re.compile(json_schema_to_regex(Pet))
    assert pattern.fullmatch('{"pet":{"kind":"cat","lives":9},"tags":["a"]}')
    assert pattern.fullmatch('{"pet":{"kind":"dog","name":null}}')
    assert not pattern.fullmatch('{"pet":{"kind":"cat","lives":10}}')
    assert not pattern.fullmatch('{"pet":{"kind":"cow"}}')
    assert re.fullmatch(json_schema_to_regex('{"type": "boolean"}'), "true")


def test_whitespace_option():
    schema = {"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]}
    assert not matcher(schema).fullmatch('{ "a": [] }')
    spaced = matcher(schema, whitespace="[ ]?")
    assert spaced.fullmatch('{ "a" : [ ] }')
    assert spaced.fullmatch('{"a":[1, 2]}')
    assert not spaced.fullmatch(' {"a":[]}')  # never before or after the whole value


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"type": "integer", "multipleOf": 17}, "multipleOf", "#"),
        ({"type": "number", "multipleOf": 0.3}, "multipleOf", "#"),
        ({"properties": {"age": {"multipleOf": 0.3}}}, "multipleOf", "#/properties/age"),
        ({"items": {"not": {"format": "date"}}}, "format", "#/items/not"),
        ({"not": {"multipleOf": 3}}, "multipleOf", "#/not"),
        ({"contains": {"type": "string"}, "maxItems": 3}, "contains", "#"),
        (
            {"patternProperties": {"^a": {}, "^b": {}, "^c": {}, "^d": {}, "^e": {"type": "null"}}},
            "patternProperties",
            "#",
        ),
        (
            {"patternProperties": {"^a": {"type": "null"}}, "propertyNames": {"maxLength": 3}},
            "patternProperties",
            "#",
        ),
        ({"if": {"format": "date"}, "then": {"maxLength": 3}}, "format", "#/if"),
        ({"pattern": "x(?=a)"}, "pattern", "#"),
        ({"contains": {"type": "null"}, "unevaluatedItems": False}, "unevaluatedItems", "#"),
        (
            {
                "allOf": [{"patternProperties": {"^a": {"type": "null"}}}],
                "additionalProperties": False,
            },
            "patternProperties",
            "#",
        ),
        ({"$ref": "https://example.com/other.json"}, "$ref", "#/$ref"),
        (
            {
                "properties": {"a": {}},
                "propertyNames": {"maxLength": 3},
                "additionalProperties": {},
            },
            "propertyNames",
            "#",
        ),
        ({"$recursiveRef": "#"}, "$recursiveRef", "#"),
    ],
)
def test_rejected_keywords_name_keyword_and_path(schema, keyword, path):
    with pytest.raises(UnsupportedSchemaError) as error:
        json_schema_to_regex(schema)
    assert (error.value.keyword, error.value.path) == (keyword, path)
    assert f"unsupported keyword {keyword!r} at {path}" in str(error.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="schema is not valid JSON"):
        json_schema_to_regex("{nope")
    with pytest.raises(TypeError, match="schema must be"):
        json_schema_to_regex(3)
    with pytest.raises(ValueError, match="'minLength' must be a non-negative integer"):
        json_schema_to_regex({"minLength": -1})
    with pytest.raises(ValueError, match="whitespace"):
        json_schema_to_regex({}, whitespace="(")
    assert issubclass(UnsupportedSchemaError, ValueError)
    with pytest.raises(UnsupportedSchemaError, match="characters"):
        json_schema_to_regex({}, any_value_depth=7)  # 4x per level: too large to compile


DIALECT_SCHEMAS = [
    {"type": "string", "pattern": "[&~-]{2}.", "maxLength": 4},
    {"type": "string", "format": "uri"},
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[à-ÿ-]+$"}}},
    {"type": "string", "format": "email"},
    {"type": "integer", "minimum": -37, "maximum": 1234},
    {
        "type": "object",
        "properties": {"k": {"const": 'a\\b"c\n'}},
        "additionalProperties": {"type": "null"},
    },
    {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}},
]


@pytest.mark.parametrize("schema", DIALECT_SCHEMAS)
def test_regex_dialect_accepted_by_outlines_core_and_interegular(schema):
    import interegular
    from outlines_core import Index, Vocabulary

    from radixgen.constrained.regex_index import validate_regex

    regex = json_schema_to_regex(schema)
    validate_regex(regex)  # the engine's own up-front check (interegular + class syntax)
    byte_tokens = {bytes([byte]): [byte] for byte in range(255)}
    index = Index(regex, Vocabulary(255, byte_tokens))
    assert index.get_initial_state() is not None
    assert interegular.parse_pattern(regex).to_fsm() is not None


# ---- property test: jsonschema validity iff regex match ----

_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-300, 300),
    # Bounded numbers are written without exponent and integers without ".0" (documented).
    st.floats(-50, 50, allow_nan=False).filter(lambda x: not x.is_integer() and "e" not in repr(x)),
    st.text(alphabet='ab"\\\n é😀', max_size=4),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=2)
    ),
    max_leaves=6,
)

PROPERTY_SCHEMAS = [
    # Exact negation: not, if/then/else, overlapping oneOf, contains, excluded values.
    {"type": ["number", "null", "boolean"], "not": {"type": "integer"}},
    {"if": {"type": "integer"}, "then": {"minimum": 5}, "else": {"type": ["string", "null"]}},
    {"oneOf": [{"type": "integer", "maximum": 10}, {"type": "number", "minimum": 0}]},
    {
        "type": "array",
        "items": {"type": ["integer", "string"]},
        "contains": {"type": "string"},
        "minContains": 1,
        "maxContains": 2,
    },
    {
        "type": "array",
        "items": {"type": ["integer", "null", "boolean"]},
        "not": {"items": {"type": "integer"}},
    },
    {"type": ["string", "integer", "null"], "not": {"enum": ["a", 1, None]}},
    {"type": "number", "not": {"const": 2.5}, "minimum": -3, "maximum": 3},
    # Pattern languages combined as automata: negation, intersection, exclusions.
    {"type": "string", "not": {"pattern": "^a|é$"}, "maxLength": 3},
    {"type": "string", "allOf": [{"pattern": "a"}, {"pattern": "b"}]},
    {"type": "string", "minLength": 1, "maxLength": 3, "not": {"enum": ["a", "ab", "é"]}},
    {
        "if": {"type": "string", "pattern": "^a"},
        "then": {"maxLength": 2},
        "else": {"type": "string"},
    },
    {"type": "integer", "minimum": -20, "exclusiveMaximum": 200},
    {"type": ["string", "null"], "minLength": 1, "maxLength": 3},
    {"type": "number", "minimum": -2, "maximum": 3},
    {"type": "number", "exclusiveMinimum": -0.5, "maximum": 7.25},
    {
        "type": "array",
        "prefixItems": [{"type": "boolean"}],
        "items": {"type": "integer"},
        "maxItems": 3,
    },
    {"anyOf": [{"type": "string", "pattern": "^a"}, {"type": "integer", "minimum": 0}]},
    {"enum": ["a", 1, None, [True]]},
    {"minimum": 2, "maxLength": 2, "maxItems": 1},
    {
        "allOf": [
            {"type": "array", "items": {"type": "integer", "minimum": 0}},
            {"maxItems": 2, "prefixItems": [{"maximum": 5}]},
        ]
    },
    {
        "oneOf": [
            {"type": "integer", "maximum": 0},
            {"type": "string", "maxLength": 1},
            {"const": None},
        ]
    },
]
_OBJECT_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "maximum": 10}, "b": {"type": "string"}, "c": {}},
    "required": ["b"],
    "additionalProperties": False,
}


def _nesting(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_nesting, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_nesting, value.values()), default=0)
    return 0


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(schema_index=st.integers(0, len(PROPERTY_SCHEMAS) - 1), value=_VALUES)
def test_random_instances_match_iff_valid(schema_index, value):
    assume(_nesting(value) <= 2)  # where any value is allowed, containers nest 2 levels
    schema = PROPERTY_SCHEMAS[schema_index]
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert bool(matcher(schema).fullmatch(compact(value))) == expected, (schema, value)


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional={key: _VALUES for key in "abc"}))
def test_random_objects_in_declared_order_match_iff_valid(value):
    assume(_nesting(value.get("c")) <= 2)  # "c" allows any value: containers nest 2 levels
    ordered = {key: value[key] for key in "abc" if key in value}
    expected = jsonschema.Draft202012Validator(_OBJECT_SCHEMA).is_valid(ordered)
    assert bool(matcher(_OBJECT_SCHEMA).fullmatch(compact(ordered))) == expected, ordered


# Objects: keys come in declared order, so other orders are valid but unmatched; soundness only.
SOUNDNESS_OBJECT_SCHEMAS = [
    {"dependentRequired": {"a": ["b"]}, "properties": {"b": {"type": "integer"}}},
    {"dependentSchemas": {"a": {"properties": {"b": {"type": "string"}}, "required": ["b"]}}},
    {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}], "unevaluatedProperties": False},
    {"if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["b"]}},
    {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"not": {"properties": {"a": {"type": "integer"}}}, "type": "object"},
    {"minProperties": 1, "maxProperties": 2, "type": "object"},
    {
        "patternProperties": {"^a": {"type": "integer"}, "b": {"type": "string"}},
        "additionalProperties": False,
    },
    {"patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": {"type": "null"}},
    {"patternProperties": {"^a": {"type": "integer"}}, "unevaluatedProperties": {"type": "null"}},
    {"allOf": [{"patternProperties": {"b": {"type": "string"}}}], "unevaluatedProperties": False},
]


@settings(max_examples=300, deadline=None)
@given(schema_index=st.integers(0, len(SOUNDNESS_OBJECT_SCHEMAS) - 1), value=_VALUES)
def test_random_objects_never_match_when_invalid(schema_index, value):
    schema = SOUNDNESS_OBJECT_SCHEMAS[schema_index]
    if bool(matcher(schema, allow_undeclared_properties=True).fullmatch(compact(value))):
        assert jsonschema.Draft202012Validator(schema).is_valid(value), (schema, value)


def test_exponential_or_too_deep_schemas_are_refused_at_once():
    # The classic exponential DFA: the n-th character from the end is an "a".
    exponential = {"type": "string", "pattern": "^(a|b)*a(a|b){12}$", "not": {"pattern": "bbb"}}
    with pytest.raises(UnsupportedSchemaError, match="'pattern' at #: .*automaton states"):
        json_schema_to_regex(exponential)
    with pytest.raises(UnsupportedSchemaError, match="'multipleOf' at #"):
        json_schema_to_regex({"type": "integer", "multipleOf": 123456789})
    deep: dict = {"type": "string"}
    for _ in range(400):
        deep = {"type": "array", "items": deep}
    with pytest.raises(UnsupportedSchemaError, match="nested too deeply"):
        json_schema_to_regex(deep)


@pytest.mark.parametrize(
    ("schema", "keyword", "path", "reason"),
    [
        ({"type": "number", "minimum": 10, "maximum": 1}, "minimum", "#", "leave no number"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength", "#", "above maxLength"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems", "#", "above maxItems"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "type", "#/allOf/0", "no type"),
        ({"const": 1, "enum": [2, 3]}, "enum", "#", "no enum/const value"),
        (False, "false", "#", "is false"),
        (
            {"type": "object", "properties": {"a": False}, "required": ["a"]},
            "required",
            "#",
            "'a' is required",
        ),
        (
            {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 5, "exclusiveMaximum": 5}},
                "required": ["x"],
            },
            "minimum",
            "#/properties/x",
            "leave no integer",
        ),
    ],
)
def test_contradictions_name_the_keyword_and_path(schema, keyword, path, reason):
    with pytest.raises(UnsatisfiableSchemaError) as error:
        json_schema_to_regex(schema)
    assert (error.value.keyword, error.value.path) == (keyword, path)
    assert str(error.value).startswith("no value satisfies the schema: ")
    assert reason in str(error.value)
    assert isinstance(error.value, UnsupportedSchemaError)


@pytest.mark.parametrize(
    "schema",
    [
        {"patternProperties": {"(": {"type": "string"}}},
        {"pattern": "(?<n"},
        {"pattern": "[a"},
        {"dependencies": 3},
        {"properties": [1]},
        {"anyOf": [3]},
        {"if": 3, "then": {}},
    ],
)
def test_malformed_schemas_raise_value_errors(schema):
    with pytest.raises(ValueError):  # UnsupportedSchemaError is one too: a 400, never a 500
        json_schema_to_regex(schema)
