"""Regexes for the string `format`s we enforce, each a strict subset of its standard.

Every regex here matches only values that are valid for the format, so a generated value is
always valid; a few rare valid spellings are not produced (documented per format). Except for
`ENCODED_FORMATS`, none can match `"`, `\\` or a control character, so the value and its JSON
encoding are the same text.
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
# A time alone may be a leap second; we write it only at 23:59 UTC.
TIME_OR_LEAP_SECOND = f"(?:{TIME}|23:59:60(?:\\.[0-9]+)?(?:[zZ]|[+\\-]00:00))"

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

# RFC 3986 IPv6address (hex groups with at most one "::", the last 32 bits may be an IPv4).
_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"(?:{_H16}:{_H16}|{IPV4})"


def _ipv6() -> str:
    forms = [f"(?:{_H16}:){{6}}{_LS32}", f"::(?:{_H16}:){{5}}{_LS32}"]
    for before, after in ((0, 4), (1, 3), (2, 2), (3, 1), (4, 0)):  # [*n(h16:)h16]::m(h16:)ls32
        head = f"(?:(?:{_H16}:){{0,{before}}}{_H16})?" if before else f"(?:{_H16})?"
        forms.append(f"{head}::(?:{_H16}:){{{after}}}{_LS32}")
    forms.append(f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}")
    forms.append(f"(?:(?:{_H16}:){{0,6}}{_H16})?::")
    return "(?:" + "|".join(forms) + ")"


IPV6 = _ipv6()

# RFC 5321 Mailbox: a dot-atom local part of at most 63 characters or a quoted string (the
# limit is 64), at a host name or an address literal. The quoted form holds '"' and '\\', so
# email is written through the pattern tree (JSON escapes), see ENCODED_FORMATS.
_ATEXT = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\\-]"
_QUOTED_LOCAL = '"(?:[ !#-\\[\\]-~]|\\\\[ -~]){0,62}"'
_ADDRESS_LITERAL = f"\\[(?:{IPV4}|IPv6:{IPV6})\\]"
EMAIL = f"(?:{_ATEXT}(?:\\.?{_ATEXT}){{0,31}}|{_QUOTED_LOCAL})@(?:{HOSTNAME}|{_ADDRESS_LITERAL})"

# RFC 3986 URI and URI-reference (= URI / relative-ref), and RFC 3987 IRIs, which also allow
# the "ucschar" ranges where URIs allow unreserved characters. Hosts: registered names and IP
# literals.
_PCT = f"%{_HEX}{_HEX}"
_ASCII_UNRESERVED_SUBDELIMS = "a-zA-Z0-9\\-._~!$&'()*+,;="
_UCSCHAR = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef\U00010000-\U0001fffd"


def _uri_grammar(unreserved_subdelims: str) -> tuple[str, str]:
    """(absolute URI, URI reference) regexes over the given unreserved + sub-delims class."""
    plain = f"[{unreserved_subdelims}]"
    pchar = f"(?:{plain}|[:@]|{_PCT})"
    segment = f"{pchar}*"
    userinfo = f"(?:{plain}|:|{_PCT})*@"
    reg_name = f"(?:{plain}|{_PCT})*"
    ip_literal = f"\\[(?:{IPV6}|[vV]{_HEX}+\\.(?:[{_ASCII_UNRESERVED_SUBDELIMS}]|:)+)\\]"
    authority = f"(?:{userinfo})?(?:{reg_name}|{ip_literal})(?::[0-9]*)?"
    query_or_fragment = f"(?:\\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?"

    def hierarchy(first_segment: str) -> str:
        """ "//" authority path-abempty / path-absolute / path from `first_segment` / empty."""
        return (
            f"(?://{authority}(?:/{segment})*"
            f"|/(?:{pchar}+(?:/{segment})*)?"
            f"|{first_segment}(?:/{segment})*"
            ")?"
        )

    absolute = f"[a-zA-Z][a-zA-Z0-9+\\-.]*:{hierarchy(f'{pchar}+')}{query_or_fragment}"
    # A relative reference's first segment has no ':' (it would read as a scheme).
    relative = hierarchy(f"(?:{plain}|@|{_PCT})+") + query_or_fragment
    return absolute, f"(?:{absolute}|{relative})"


URI, URI_REFERENCE = _uri_grammar(_ASCII_UNRESERVED_SUBDELIMS)
IRI, IRI_REFERENCE = _uri_grammar(_ASCII_UNRESERVED_SUBDELIMS + _UCSCHAR)

# RFC 6570 URI Template: literals (ASCII subset) and expressions {op? var[:n|*], ...}.
_TEMPLATE_LITERAL = f"(?:[a-zA-Z0-9!#$&()*+,\\-./:;=?@_~\\[\\]]|{_PCT})"
_VARCHAR = f"(?:[a-zA-Z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
_EXPRESSION = f"\\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\\}}"
URI_TEMPLATE = f"(?:{_TEMPLATE_LITERAL}|{_EXPRESSION})*"

# RFC 3339 appendix A duration (ISO 8601): P[nY[nM[nD]]|nM[nD]|nD][T...] or PnW.
_DIGITS = "[0-9]+"
_DUR_SECOND = f"{_DIGITS}S"
_DUR_MINUTE = f"{_DIGITS}M(?:{_DUR_SECOND})?"
_DUR_HOUR = f"{_DIGITS}H(?:{_DUR_MINUTE})?"
_DUR_TIME = f"T(?:{_DUR_HOUR}|{_DUR_MINUTE}|{_DUR_SECOND})"
_DUR_DAY = f"{_DIGITS}D"
_DUR_MONTH = f"{_DIGITS}M(?:{_DUR_DAY})?"
_DUR_YEAR = f"{_DIGITS}Y(?:{_DUR_MONTH})?"
DURATION = f"P(?:(?:{_DUR_DAY}|{_DUR_MONTH}|{_DUR_YEAR})(?:{_DUR_TIME})?|{_DUR_TIME}|{_DIGITS}W)"

# RFC 6901 JSON pointer (any character but '/' and '~' unescaped, so written through the
# pattern tree), and the relative JSON pointer draft (a non-negative integer, then '#' or a
# JSON pointer).
JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"
RELATIVE_JSON_POINTER = f"(?:0|[1-9][0-9]*)(?:#|{JSON_POINTER})"

# ECMA-262 regexes: a strict subset of literal characters and '.', each optionally quantified,
# optionally anchored; always a valid regex, never one with a backslash (no JSON escaping).
REGEX = "\\^?(?:(?:[a-zA-Z0-9 _,:;'=<>!@%/#&~\\-]|\\.)[*+?]?)*\\$?"

# OpenAPI "byte": padded base64.
BASE64 = "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"

# Formats whose values may hold '"', '\\' or control characters: their regexes describe the
# decoded value and are written through the pattern tree, which adds JSON escapes.
ENCODED_FORMATS = frozenset({"email", "idn-email", "json-pointer", "relative-json-pointer"})

FORMAT_REGEXES: dict[str, str] = {
    "date-time": DATE_TIME,
    "date": DATE,
    "time": TIME_OR_LEAP_SECOND,
    "uuid": UUID,
    "email": EMAIL,
    "hostname": HOSTNAME,
    "ipv4": IPV4,
    "uri": URI,
    "uri-reference": URI_REFERENCE,
    "uri-template": URI_TEMPLATE,
    "iri": IRI,
    "iri-reference": IRI_REFERENCE,
    # Every ASCII host name is an IDNA one: strict subsets.
    "idn-hostname": HOSTNAME,
    "idn-email": EMAIL,
    "ipv6": IPV6,
    "duration": DURATION,
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "regex": REGEX,
    "byte": BASE64,
}
