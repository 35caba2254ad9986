"""Exact regexes for bounded JSON integers and numbers.

Integers are written canonically: no leading zeros, no `+`, and zero only as `0` (never `-0`,
which parses to the same value, so no value is lost). A range of integers becomes a union of
digit patterns per digit count, e.g. [7, 123] -> `[7-9]|[1-9][0-9]|1[0-1][0-9]|12[0-3]`.

Numbers with bounds are written without an exponent (every finite decimal has such a spelling),
so a bound is decided on the integer part, then digit by digit on the fraction (like the integer
ranges, but on digit strings of any length compared as 0.F).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from radixgen.constrained.regex_text import alternation, optional, sequence

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


def number_range_regex(
    lower: Bound | None, upper: Bound | None, non_integer: bool = False
) -> str | None:
    """Exponent-free decimals x with lower <= x <= upper (strict where the bound is exclusive).

    Bounds must have finite decimal expansions (every JSON number does). `-0` and `-0.0` are
    never produced. Comparison is on the decimal value written, digit by digit. `non_integer`
    keeps only numbers with a nonzero fraction digit (JSON Schema's non-integers).
    """
    # x >= 0, written without a sign: x is its own magnitude.
    if lower is None or lower.value < 0:
        positive_low = Bound(Fraction(0), False)
    else:
        positive_low = lower
    positive = _magnitude_regex(positive_low, upper, non_integer)
    # x < 0, written as "-" + m with m = -x > 0.
    negative = None
    if lower is None or lower.value < 0:
        if upper is None or upper.value >= 0:
            magnitude_low = Bound(Fraction(0), True)
        else:
            magnitude_low = Bound(-upper.value, upper.exclusive)
        magnitude_high = None if lower is None else Bound(-lower.value, lower.exclusive)
        magnitudes = _magnitude_regex(magnitude_low, magnitude_high, non_integer)
        negative = sequence("-", magnitudes) if magnitudes is not None else None
    return alternation([positive, negative])


def _magnitude_regex(lower: Bound, upper: Bound | None, non_integer: bool) -> str | None:
    """Unsigned decimals m = I.F within the bounds, decided on I and then on F's digits."""
    low_int, low_digits = _split_decimal(lower.value)
    if upper is None:
        high_int, high_digits = None, ""
    else:
        high_int, high_digits = _split_decimal(upper.value)
        if high_int < low_int:
            return None
    pieces = []
    # Integer parts strictly between the bounds' integer parts admit any fraction.
    whole = _natural_range(low_int + 1, None if high_int is None else high_int - 1)
    # A non-integer's fraction is above 0: a strict lower bound where the bound is integral.
    low_strict = lower.exclusive or (non_integer and low_digits == "")
    if whole is not None:
        pieces.append(sequence(whole, _NONZERO_FRACTION if non_integer else _ANY_FRACTION))
    if high_int is None or high_int > low_int:
        fraction = _fraction_part(low_digits, low_strict, None, False)
        pieces.append(sequence(str(low_int), fraction))
        if high_int is not None:
            fraction = _fraction_part("", non_integer, high_digits, upper.exclusive)
            pieces.append(sequence(str(high_int), fraction))
    else:  # both bounds share the integer part
        fraction = _fraction_part(low_digits, low_strict, high_digits, upper.exclusive)
        pieces.append(sequence(str(low_int), fraction))
    return alternation(pieces)


def _split_decimal(value: Fraction) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of a non-negative decimal."""
    scale = 0
    while (value * 10**scale).denominator != 1:
        scale += 1
        if scale > 400:
            raise ValueError(f"bound {value} has no finite decimal expansion")
    scaled = int(value * 10**scale)
    integer_part, fraction = divmod(scaled, 10**scale)
    digits = str(fraction).rjust(scale, "0").rstrip("0") if scale else ""
    return integer_part, digits


def _fraction_part(low: str, low_strict: bool, high: str | None, high_strict: bool) -> str | None:
    """The optional `.digits` of a number whose fraction 0.F lies between 0.low and 0.high.

    `high` None: no upper bound (below 1). An absent fraction counts as 0.
    """
    zero_allowed = low == "" and not low_strict and (high is None or high != "" or not high_strict)
    digits = _fraction_digits(low, low_strict, high, high_strict, nonempty=True)
    written = None if digits is None else sequence("\\.", digits)
    if zero_allowed:
        return optional(written)
    return written


def _fraction_digits(
    low: str, low_strict: bool, high: str | None, high_strict: bool, nonempty: bool
) -> str | None:
    """Digit strings D with 0.low < (<=) 0.D < (<=) 0.high, compared digit by digit."""
    any_digits = f"{DIGIT}+" if nonempty else f"{DIGIT}*"
    if high == "":  # 0.D <= 0: only zeros
        if high_strict or low_strict or low != "":
            return None
        return "0+" if nonempty else "0*"
    if low == "" and high is None:
        return f"{DIGIT}*[1-9]{DIGIT}*" if low_strict else any_digits
    first_low = low[0] if low else "0"
    rest_low = low[1:]
    empty_allowed = not nonempty and low == "" and not low_strict
    if high is None:
        options = [
            first_low + _or_empty(_fraction_digits(rest_low, low_strict, None, False, False))
        ]
        if first_low != "9":
            options.append(_digit_class(str(int(first_low) + 1), "9") + f"{DIGIT}*")
    elif first_low > high[0]:
        options = []
    elif first_low == high[0]:
        rest = _fraction_digits(rest_low, low_strict, high[1:], high_strict, False)
        options = [None if rest is None else first_low + rest]
    else:
        after_low = _fraction_digits(rest_low, low_strict, None, False, False)
        options = [None if after_low is None else first_low + after_low]
        if int(high[0]) - int(first_low) > 1:
            middle = _digit_class(str(int(first_low) + 1), str(int(high[0]) - 1))
            options.append(middle + f"{DIGIT}*")
        before_high = _fraction_digits("", False, high[1:], high_strict, False)
        options.append(None if before_high is None else high[0] + before_high)
    result = alternation(options)
    if empty_allowed:
        return optional(result)
    return result


def _or_empty(regex: str | None) -> str:
    return "" if regex is None else regex


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


# Bounded ranges with at most this many multiples are written as a list of literals.
MAX_ENUMERATED_MULTIPLES = 512


def integer_multiple_regex(lowest: int | None, highest: int | None, divisor: int) -> str | None:
    """Canonical integers in [lowest, highest] divisible by `divisor` (a positive integer).

    Exact in two cases: few multiples in a bounded range (listed), or a divisor of 10**n
    (n <= 3) with no bounds, or only a lower bound of 0 or 1, decided by the last n digits.

    Raises:
        ValueError: any other combination.
    """
    if divisor == 1:
        return integer_range_regex(lowest, highest)
    if lowest is not None and highest is not None:
        first = -(-lowest // divisor) * divisor
        if first > highest:
            return None
        if (highest - first) // divisor < MAX_ENUMERATED_MULTIPLES:
            return alternation(str(value) for value in range(first, highest + 1, divisor))
    digits = next((n for n in range(1, 4) if 10**n % divisor == 0), None)
    if digits is None or highest is not None or lowest not in (None, 0, 1):
        raise ValueError(
            "multipleOf needs a bounded range with few multiples, or a divisor of 1000"
        )
    # Positive multiples: those with at most `digits` digits listed, longer ones by their last
    # `digits` digits (leading zeros allowed there).
    short = [str(value) for value in range(divisor, 10**digits, divisor)]
    endings = alternation(str(value).rjust(digits, "0") for value in range(0, 10**digits, divisor))
    positive = alternation([*short, sequence(f"[1-9]{DIGIT}*", endings)])
    zero = "0" if lowest is None or lowest <= 0 else None
    negative = None if lowest is not None else sequence("-", positive)
    return alternation([zero, positive, negative])
