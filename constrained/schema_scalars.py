"""Regexes for the scalar branches of a merged schema: null, boolean, integer, number, string.

Values excluded by a negated `enum`/`const` are removed exactly: numbers by splitting the range
at each excluded value (an exclusive bound on both sides, so `5`, `5.0` and `5e0` all go),
strings by the key-set complement of `json_string`, booleans and null by omission.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from fractions import Fraction

from radixgen.constrained.ecma_pattern import parse_pattern
from radixgen.constrained.json_string import string_excluding_keys
from radixgen.constrained.json_value_regex import SCALAR_REGEXES
from radixgen.constrained.pattern_automaton import And, Leaf, dfa_tree, language_tree
from radixgen.constrained.pattern_length import PatternError
from radixgen.constrained.pattern_tree import emit
from radixgen.constrained.regex_ranges import (
    Bound,
    integer_bounds,
    integer_multiple_regex,
    integer_range_regex,
    number_range_regex,
)
from radixgen.constrained.regex_text import alternation, sequence
from radixgen.constrained.schema_merge import MergedSchema, exact_decimal
from radixgen.constrained.string_schema import string_schema_regex
from radixgen.constrained.unsupported import UnsupportedSchemaError

# Integer divisibility is written from a remainder automaton with one state per remainder; the
# written regex grows fast with the divisor (7: 60k characters), so larger ones are refused.
MAX_REMAINDER_DIVISOR = 16
# A bounded range with at most this many multiples of a fractional step is listed.
MAX_LISTED_MULTIPLES = 512
# Numbers that are not integers (a nonzero fraction digit), without exponent: a strict subset.
NON_INTEGER = "-?(?:0|[1-9][0-9]*)\\.[0-9]*[1-9][0-9]*"


def scalar_regex(name: str, merged: MergedSchema) -> str | None:
    """The regex of scalar type `name` ("number": non-integers too) under `merged`."""
    excluded = merged.excluded
    if name == "null":
        return None if any(value is None for value in excluded) else "null"
    if name == "boolean":
        left = [v for v in (True, False) if not any(x is v for x in excluded)]
        return alternation(json.dumps(value) for value in left)
    if name in ("integer", "number"):
        return _numeric_regex(name, merged)
    return _string_regex(merged)


def _numeric_regex(name: str, merged: MergedSchema) -> str | None:
    points = sorted(
        {
            exact_decimal(value)
            for value in merged.excluded
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
    )
    regexes = []
    lower = merged.lower
    for point in points:
        if not _inside(point, lower, merged.upper):
            continue
        below = replace(merged, lower=lower, upper=Bound(point, True))
        regexes.append(_range_regex(name, below))
        lower = Bound(point, True)
    regexes.append(_range_regex(name, replace(merged, lower=lower)))
    return alternation(regexes)


def _inside(point, lower: Bound | None, upper: Bound | None) -> bool:
    above = lower is None or point > lower.value or (point == lower.value and not lower.exclusive)
    below = upper is None or point < upper.value or (point == upper.value and not upper.exclusive)
    return above and below


def _range_regex(name: str, merged: MergedSchema) -> str | None:
    with_integers = "integer" in merged.types
    if merged.multiple_of:
        return _multiples_regex(merged)
    if name == "integer":
        return integer_range_regex(*integer_bounds(merged.lower, merged.upper))
    if merged.lower is None and merged.upper is None:
        return SCALAR_REGEXES["number"] if with_integers else NON_INTEGER
    return number_range_regex(merged.lower, merged.upper, non_integer=not with_integers)


def _multiples_regex(merged: MergedSchema) -> str | None:
    """Numbers divisible by every multipleOf: integers, since each divisor is an integer here."""
    path = merged.keyword_paths["multipleOf"]
    divisor = 1
    for step in merged.multiple_of:
        if step.denominator != 1 and "number" in merged.types:
            return _fractional_multiples_regex(merged, path)
        # An integer is a multiple of p/q (lowest terms) exactly when it is a multiple of p.
        divisor = math.lcm(divisor, step.numerator)
    if "integer" not in merged.types:
        return None  # integer steps have integer multiples only
    lowest, highest = integer_bounds(merged.lower, merged.upper)
    try:
        return integer_multiple_regex(lowest, highest, divisor)
    except ValueError:
        return _remainder_multiples_regex(lowest, highest, divisor, path)


def _remainder_multiples_regex(
    lowest: int | None, highest: int | None, divisor: int, path: str
) -> str | None:
    """Integers divisible by `divisor`, from the remainder automaton, within the bounds."""
    if divisor > MAX_REMAINDER_DIVISOR:
        reason = (
            "on integers needs a bounded range with few multiples, a divisor of 1000, or a"
            f" divisor up to {MAX_REMAINDER_DIVISOR}"
        )
        raise UnsupportedSchemaError("multipleOf", path, reason)
    try:
        non_negative = emit(decimal_multiples_tree(divisor, with_zero=True))
        positive = emit(decimal_multiples_tree(divisor, with_zero=False))
        multiples = alternation([non_negative, sequence("-", positive)])
        if lowest is None and highest is None:
            return multiples
        in_range = integer_range_regex(lowest, highest)
        if in_range is None:
            return None
        both = And((Leaf(parse_pattern(f"^{multiples}$")), Leaf(parse_pattern(f"^{in_range}$"))))
        tree = language_tree(both)
    except PatternError as error:
        raise UnsupportedSchemaError("multipleOf", path, f"divisor {divisor}: {error}") from None
    return None if tree is None else emit(tree)


def _fractional_multiples_regex(merged: MergedSchema, path: str) -> str | None:
    """Multiples of fractional steps in a bounded range, listed as decimals (no exponent)."""
    lower, upper = merged.lower, merged.upper
    step = Fraction(0)
    for divisor in merged.multiple_of:  # the least common multiple of p/q and r/s
        step = (
            divisor
            if step == 0
            else Fraction(
                math.lcm(step.numerator, divisor.numerator),
                math.gcd(step.denominator, divisor.denominator),
            )
        )
    if lower is None or upper is None or (upper.value - lower.value) / step > MAX_LISTED_MULTIPLES:
        return _unit_fraction_multiples_regex(merged, step, path)
    first = math.ceil(lower.value / step)
    values = [k * step for k in range(first, math.floor(upper.value / step) + 1)]
    kept = [
        v
        for v in values
        if _inside(v, lower, upper) and ("integer" in merged.types or v.denominator != 1)
    ]
    return alternation(_decimal_text(value) for value in kept)


def _unit_fraction_multiples_regex(merged: MergedSchema, step: Fraction, path: str) -> str | None:
    """Multiples of a step 1/n (0.01, 0.25, 0.5...): exactly the decimals whose fraction is one of
    the n multiples below 1 (every integer is a multiple), within the bounds (by automaton)."""
    places = next((k for k in range(1, 13) if 10**k == step.denominator), None)
    listable = step.denominator <= MAX_LISTED_MULTIPLES and 10**40 % step.denominator == 0
    if step.numerator != 1 or not (places or listable):
        reason = (
            f"a fractional multipleOf on 'number' needs bounds with at most {MAX_LISTED_MULTIPLES}"
            " multiples, or a step 1/n with a finite decimal (0.01, 0.25, 0.5...)"
        )
        raise UnsupportedSchemaError("multipleOf", path, reason)
    with_integers = "integer" in merged.types
    if places:  # 1/10^k: at most k significant fraction digits
        options = [f"\\.[0-9]{{0,{places - 1}}}[1-9]0*"]
    else:
        fractions = (_decimal_text(i * step).partition(".")[2] for i in range(1, step.denominator))
        options = [f"\\.{digits}0*" for digits in fractions]
    options += ["(?:\\.0+)?"] if with_integers else []
    multiples = f"-?(?:0|[1-9][0-9]*)(?:{'|'.join(options)})"
    if merged.lower is None and merged.upper is None:
        return multiples
    in_range = number_range_regex(merged.lower, merged.upper)
    if in_range is None:
        return None
    language = And((Leaf(parse_pattern(f"^{multiples}$")), Leaf(parse_pattern(f"^{in_range}$"))))
    try:
        tree = language_tree(language)
    except PatternError as error:
        raise UnsupportedSchemaError("multipleOf", path, str(error)) from None
    return None if tree is None else emit(tree)


def _decimal_text(value: Fraction) -> str:
    """A finite decimal written without exponent, as a regex (the point escaped)."""
    sign = "-" if value < 0 else ""
    integer, remainder = divmod(abs(value.numerator), value.denominator)
    digits = ""
    while remainder:
        remainder *= 10
        digits += str(remainder // value.denominator)
        remainder %= value.denominator
        if len(digits) > 40:
            raise ValueError(f"{value} has no short decimal expansion")
    return f"{sign}{integer}" + (f"\\.{digits}" if digits else "")


def _string_regex(merged: MergedSchema) -> str | None:
    regex = string_schema_regex(merged)
    if regex is None:
        return None
    excluded = [value for value in merged.excluded if isinstance(value, str)]
    hits = [v for v in excluded if re.fullmatch(regex, json.dumps(v, ensure_ascii=False))]
    if not hits:
        return regex
    plain = not merged.patterns and not merged.not_patterns and merged.format is None
    if plain and merged.min_length == 0 and merged.max_length is None:
        return string_excluding_keys(hits)  # every spelling of every other string
    return string_schema_regex(merged, hits)


def decimal_multiples_tree(divisor: int, with_zero: bool) -> object | None:
    """Canonical positive decimal integers (and "0" if `with_zero`) divisible by `divisor`.

    The remainder automaton reads digits left to right (r -> (10 r + digit) mod divisor), so
    divisibility by any integer is regular; written back as a tree by state elimination.
    """
    digits = [ord(str(digit)) for digit in range(10)]
    starts = sorted({0, *digits, digits[-1] + 1})  # each digit its own interval
    symbol_of = {chr(code): starts.index(code) for code in digits}
    start, zero, dead, first_residue = 0, 1, 2, 3
    transitions = [[dead] * len(starts) for _ in range(first_residue + divisor)]
    transitions[start][symbol_of["0"]] = zero
    for digit in range(1, 10):
        transitions[start][symbol_of[str(digit)]] = first_residue + digit % divisor
    for residue in range(divisor):
        for digit in range(10):
            target = first_residue + (10 * residue + digit) % divisor
            transitions[first_residue + residue][symbol_of[str(digit)]] = target
    accepting = {first_residue} | ({zero} if with_zero else set())
    return dfa_tree(transitions, accepting, starts)
