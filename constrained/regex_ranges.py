"""Exact regexes for bounded JSON integers and numbers.

Integers are written canonically: no leading zeros, no `+`, and zero only as `0` (never `-0`,
which parses to the same value, so no value is lost). A range of integers becomes a union of
digit patterns per digit count, e.g. [7, 123] -> `[7-9]|[1-9][0-9]|1[0-1][0-9]|12[0-3]`.

Numbers with bounds are written without an exponent (every finite decimal has such a spelling),
so the bound can be decided on the integer part and on whether the fraction is zero. Only bounds
with integer values are supported here; the caller rejects fractional bounds on `number`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from radixgen.constrained.regex_text import alternation, sequence

DIGIT = "[0-9]"
NATURAL = "(?:0|[1-9][0-9]*)"
INTEGER = "-?" + NATURAL
NUMBER = INTEGER + "(?:\\.[0-9]+)?(?:[eE][+\\-]?[0-9]+)?"
_ANY_FRACTION = "(?:\\.[0-9]+)?"
_ZERO_FRACTION = "(?:\\.0+)?"
_NONZERO_FRACTION = "\\.[0-9]*[1-9][0-9]*"


@dataclass(frozen=True)
class Bound:
    """One side of a numeric range: the limit and whether the limit itself is excluded."""

    value: Fraction
    exclusive: bool


def integer_range_regex(lowest: int | None, highest: int | None) -> str | None:
    """Canonical integers in [lowest, highest]; None means unbounded on that side."""
    if lowest is not None and highest is not None and lowest > highest:
        return None
    non_negative = None
    if highest is None or highest >= 0:
        non_negative = _natural_range(max(lowest or 0, 0), highest)
    negative = None
    if lowest is None or lowest <= -1:
        magnitude_low = 1 if highest is None or highest >= 0 else -highest
        magnitude_high = None if lowest is None else -lowest
        magnitudes = _natural_range(magnitude_low, magnitude_high)
        negative = sequence("-", magnitudes) if magnitudes is not None else None
    return alternation([non_negative, negative])


def integer_bounds(lower: Bound | None, upper: Bound | None) -> tuple[int | None, int | None]:
    """The inclusive integer range that satisfies `lower` and `upper`."""
    lowest = highest = None
    if lower is not None:
        floor = lower.value.numerator // lower.value.denominator
        lowest = floor + 1 if (lower.exclusive or floor < lower.value) else floor
    if upper is not None:
        floor = upper.value.numerator // upper.value.denominator
        highest = floor - 1 if (upper.exclusive and floor == upper.value) else floor
    return lowest, highest


def number_range_regex(lower: Bound | None, upper: Bound | None) -> str | None:
    """Exponent-free decimals x with lower <= x <= upper (strict where the bound is exclusive).

    Both bounds must have integer values. `-0` and `-0.0` are never produced.
    """
    for bound in (lower, upper):
        if bound is not None and bound.value.denominator != 1:
            raise ValueError("number bounds must be integers")
    # x >= 0, written without a sign: x is its own magnitude.
    if lower is None or lower.value < 0:
        positive_low = Bound(Fraction(0), False)
    else:
        positive_low = lower
    positive = _magnitude_regex(positive_low, upper)
    # x < 0, written as "-" + m with m = -x > 0.
    negative = None
    if lower is None or lower.value < 0:
        if upper is None or upper.value >= 0:
            magnitude_low = Bound(Fraction(0), True)
        else:
            magnitude_low = Bound(-upper.value, upper.exclusive)
        magnitude_high = None if lower is None else Bound(-lower.value, lower.exclusive)
        magnitudes = _magnitude_regex(magnitude_low, magnitude_high)
        negative = sequence("-", magnitudes) if magnitudes is not None else None
    return alternation([positive, negative])


def _magnitude_regex(lower: Bound, upper: Bound | None) -> str | None:
    """Unsigned decimals m (integer part, optional fraction) within the two bounds."""
    low = int(lower.value)
    high = None if upper is None else int(upper.value)
    pieces = []
    # Integer parts strictly inside the range admit any fraction.
    any_fraction_low = low + 1 if lower.exclusive else low
    any_fraction_high = None if high is None else high - 1
    whole = _natural_range(any_fraction_low, any_fraction_high)
    if whole is not None:
        pieces.append(sequence(whole, _ANY_FRACTION))
    # m > low with integer part == low needs a non-zero fraction (and then m < low + 1 <= high).
    if lower.exclusive and (high is None or high > low):
        pieces.append(sequence(str(low), _NONZERO_FRACTION))
    # m <= high with integer part == high needs a zero fraction.
    if upper is not None and not upper.exclusive:
        if high > low or (high == low and not lower.exclusive):
            pieces.append(sequence(str(high), _ZERO_FRACTION))
    return alternation(pieces)


def _natural_range(lowest: int, highest: int | None) -> str | None:
    """Canonical non-negative integers in [lowest, highest] (highest None: unbounded)."""
    lowest = max(lowest, 0)
    if highest is not None and highest < lowest:
        return None
    if highest is None and lowest <= 1:
        return NATURAL if lowest == 0 else f"[1-9]{DIGIT}*"
    if highest is None:
        digits = len(str(lowest))
        bounded = _natural_range(lowest, 10**digits - 1)
        return alternation([bounded, f"[1-9]{DIGIT}{{{digits},}}"])
    pieces = []
    for digits in range(len(str(lowest)), len(str(highest)) + 1):
        first = 0 if digits == 1 else 10 ** (digits - 1)
        last = 10**digits - 1
        pieces.append(_same_length_range(str(max(lowest, first)), str(min(highest, last))))
    return alternation(pieces)


def _same_length_range(low: str, high: str) -> str:
    """Digit strings of one length between `low` and `high` (lexicographic = numeric)."""
    if low == high:
        return low
    if len(low) == 1:
        return _digit_class(low, high)
    if low[0] == high[0]:
        return low[0] + _same_length_range(low[1:], high[1:])
    rest = len(low) - 1
    tail = DIGIT if rest == 1 else f"{DIGIT}{{{rest}}}"
    pieces = []
    middle_first, middle_last = int(low[0]) + 1, int(high[0]) - 1
    if low[1:] == "0" * rest:
        middle_first -= 1
    else:
        pieces.append(low[0] + _same_length_range(low[1:], "9" * rest))
    high_piece = None
    if high[1:] == "9" * rest:
        middle_last += 1
    else:
        high_piece = high[0] + _same_length_range("0" * rest, high[1:])
    if middle_first <= middle_last:
        pieces.append(_digit_class(str(middle_first), str(middle_last)) + tail)
    if high_piece is not None:
        pieces.append(high_piece)
    return alternation(pieces)


def _digit_class(low: str, high: str) -> str:
    """One digit between `low` and `high`."""
    if low == high:
        return low
    if (low, high) == ("0", "9"):
        return DIGIT
    return f"[{low}-{high}]"
