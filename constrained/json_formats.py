"""Regexes for the string `format`s we enforce, each a strict subset of its standard.

Every regex here matches only values that are valid for the format, so a generated value is
always valid; a few rare valid spellings are not produced (documented per format). All are
plain ASCII with no `"` or `\\`, so the value and its JSON encoding are the same text.
"""

from __future__ import annotations

_HEX = "[0-9a-fA-F]"
_TWO_DIGITS_00_59 = "[0-5][0-9]"

# RFC 3339 full-date, with the real number of days per month, leap years included.
_MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_LEAP_YEAR_TWO_DIGITS = "(?:0[48]|[2468][048]|[13579][26])"
_LEAP_DAY = f"(?:[0-9][0-9]{_LEAP_YEAR_TWO_DIGITS}|(?:{_LEAP_YEAR_TWO_DIGITS[3:-1]}|00)00)-02-29"
DATE = f"(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_DAY})"

# RFC 3339 full-time without leap seconds (second 60 is valid only at 23:59 UTC, which
# depends on the offset; we never produce it).
_HOUR = "(?:[01][0-9]|2[0-3])"
_OFFSET = f"(?:[zZ]|[+\\-]{_HOUR}:{_TWO_DIGITS_00_59})"
TIME = f"{_HOUR}:{_TWO_DIGITS_00_59}:{_TWO_DIGITS_00_59}(?:\\.[0-9]+)?{_OFFSET}"
DATE_TIME = f"{DATE}[tT]{TIME}"

UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"

# Dotted quad, no leading zeros (they would read as octal in some parsers).
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens. At most four
# labels of at most 62 characters keep the whole name under the 253-character limit; the third
# character of a label is never a hyphen, which rules out "xn--" (Punycode) and other reserved
# "??--" labels that need IDNA validation.
_ALNUM = "[a-zA-Z0-9]"
_LABEL = f"{_ALNUM}(?:{_ALNUM}|[a-zA-Z0-9\\-]{_ALNUM}(?:[a-zA-Z0-9\\-]{{0,58}}{_ALNUM})?)?"
HOSTNAME = f"{_LABEL}(?:\\.{_LABEL}){{0,3}}"

# RFC 5321 Mailbox with a dot-atom local part of at most 63 characters (the limit is 64).
# Quoted local parts and address literals are valid but never produced.
_ATEXT = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\\-]"
EMAIL = f"{_ATEXT}(?:\\.?{_ATEXT}){{0,31}}@{HOSTNAME}"

# RFC 3986 absolute URI: scheme ":" hier-part ["?" query] ["#" fragment]. IP-literal hosts
# (`[...]`) are valid but never produced.
_PCT = f"%{_HEX}{_HEX}"
_UNRESERVED_SUBDELIMS = "[a-zA-Z0-9\\-._~!$&'()*+,;=]"
_PCHAR = f"(?:{_UNRESERVED_SUBDELIMS}|[:@]|{_PCT})"
_SEGMENT = f"{_PCHAR}*"
_USERINFO = f"(?:{_UNRESERVED_SUBDELIMS}|:|{_PCT})*@"
_REG_NAME = f"(?:{_UNRESERVED_SUBDELIMS}|{_PCT})*"
_AUTHORITY = f"(?:{_USERINFO})?{_REG_NAME}(?::[0-9]*)?"
_HIER_PART = (
    f"(?://{_AUTHORITY}(?:/{_SEGMENT})*"  # "//" authority path-abempty
    f"|/(?:{_PCHAR}+(?:/{_SEGMENT})*)?"  # path-absolute
    f"|{_PCHAR}+(?:/{_SEGMENT})*"  # path-rootless
    ")?"  # path-empty
)
_QUERY_OR_FRAGMENT_CHARS = f"(?:{_PCHAR}|[/?])*"
URI = (
    f"[a-zA-Z][a-zA-Z0-9+\\-.]*:{_HIER_PART}"
    f"(?:\\?{_QUERY_OR_FRAGMENT_CHARS})?(?:#{_QUERY_OR_FRAGMENT_CHARS})?"
)

FORMAT_REGEXES: dict[str, str] = {
    "date-time": DATE_TIME,
    "date": DATE,
    "time": TIME,
    "uuid": UUID,
    "email": EMAIL,
    "hostname": HOSTNAME,
    "ipv4": IPV4,
    "uri": URI,
}
