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

# RFC 3339 full-time. Second 60 (a leap second) is valid only where the time is 23:59 UTC, so
# it depends on the offset: local time minus offset. Written out for offsets whose minutes are
# 00, 30 or 45 (every real time zone; other minutes are never produced next to a leap second).
_HOUR = "(?:[01][0-9]|2[0-3])"
_OFFSET = f"(?:[zZ]|[+\\-]{_HOUR}:{_TWO_DIGITS_00_59})"
_FRACTION = "(?:\\.[0-9]+)?"
_LEAP_OFFSET_MINUTES = (0, 30, 45)


def _leap_second_times() -> str:
    """hh:mm:60[.f]offset for every offset above at which hh:mm is 23:59 UTC."""
    offsets_by_local_time: dict[str, list[str]] = {}
    utc_minute = 23 * 60 + 59
    for sign, direction in (("+", 1), ("-", -1)):
        for offset_hours in range(24):
            for offset_minutes in _LEAP_OFFSET_MINUTES:
                offset = offset_hours * 60 + offset_minutes
                local = (utc_minute + direction * offset) % (24 * 60)
                local_text = f"{local // 60:02d}:{local % 60:02d}"
                offset_text = f"\\{sign}{offset_hours:02d}:{offset_minutes:02d}"
                offsets_by_local_time.setdefault(local_text, []).append(offset_text)
    offsets_by_local_time["23:59"].append("[zZ]")
    forms = [
        f"{local}:60{_FRACTION}(?:{'|'.join(offsets)})"
        for local, offsets in sorted(offsets_by_local_time.items())
    ]
    return "(?:" + "|".join(forms) + ")"


_TIME_WITHOUT_LEAP_SECOND = f"{_HOUR}:{_TWO_DIGITS_00_59}:{_TWO_DIGITS_00_59}{_FRACTION}{_OFFSET}"
TIME = f"(?:{_TIME_WITHOUT_LEAP_SECOND}|{_leap_second_times()})"
# In a date-time, leap seconds only in UTC (Z, +00:00, -00:00): the table above makes the
# automaton remember every hour and minute, which costs outlines-core ~30x the compile time
# (0.05 s -> 1.5 s at a 32k vocabulary), for a common format, and a rare value.
DATE_TIME = f"{DATE}[tT](?:{_TIME_WITHOUT_LEAP_SECOND}|23:59:60{_FRACTION}(?:[zZ]|[+\\-]00:00))"

UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"

# Dotted quad, no leading zeros (they would read as octal in some parsers).
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens, of at most
# 63 characters. The first label may have 63, the others 62, and there are at most four: the
# whole name stays under the 253-character limit. Characters 3 and 4 of a label are never both
# hyphens, which rules out "xn--" (Punycode) and other reserved "??--" labels that need IDNA
# validation.
_ALNUM = "[a-zA-Z0-9]"


def _label(char: str, inner: str, max_length: int) -> str:
    """Labels of `char`s, with `inner` (also hyphens) inside, no "??--", 1..max_length long."""
    return (
        f"{char}(?:{char}|{inner}{char}|{inner}(?:{char}|-){char}"
        f"|{inner}(?:{char}{inner}|-{char}){inner}{{0,{max_length - 5}}}{char})?"
    )


_FIRST_LABEL = _label(_ALNUM, "[a-zA-Z0-9\\-]", 63)
_LABEL = _label(_ALNUM, "[a-zA-Z0-9\\-]", 62)
HOSTNAME = f"{_FIRST_LABEL}(?:\\.{_LABEL}){{0,3}}"

# RFC 5890 internationalised host names (IDNA 2008), a strict subset: ASCII labels as above, or
# U-labels of at most 8 characters from lower-case letters, digits, Hangul syllables, lower-case
# Greek and CJK unified ideographs (all PVALID, NFC, left-to-right, no contextual rule). At most
# 8 characters keep the Punycode A-label within 53 octets whatever the characters (each takes at
# most 6 base-36 digits), so the 63-octet label and 253-octet name limits hold. Labels may also
# be separated by the ideographic, fullwidth and halfwidth ideographic full stops.
_U_CHAR = "[a-z0-9\u03ac-\u03af\u03b1-\u03ce\u4e00-\u9fa5\uac00-\ud7a3]"
_U_INNER = "[a-z0-9\\-\u03ac-\u03af\u03b1-\u03ce\u4e00-\u9fa5\uac00-\ud7a3]"
_IDN_SEPARATOR = "[.\u3002\uff0e\uff61]"
_U_LABEL = _label(_U_CHAR, _U_INNER, 8)
IDN_HOSTNAME = f"(?:{_FIRST_LABEL}|{_U_LABEL})(?:{_IDN_SEPARATOR}(?:{_LABEL}|{_U_LABEL})){{0,3}}"

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

# RFC 5321 Mailbox: a dot-atom local part or a quoted string of at most 64 octets, at a host
# name or an address literal. The quoted form holds '"' and '\\', so email is written through
# the pattern tree (JSON escapes), see ENCODED_FORMATS. Without dots a dot-atom may have all 64
# characters; with dots we stop at 63 (a regex counting both would be much larger).
_ATEXT = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\\-]"
_QTEXT = "[ !#-\\[\\]-~]"
_QUOTED_PAIR = "\\\\[ -~]"
_QUOTED_LOCAL = f'"(?:{_QTEXT}|{_QUOTED_PAIR}){{0,62}}"'
_DOT_ATOM_LOCAL = f"(?:{_ATEXT}{{1,64}}|{_ATEXT}(?:\\.?{_ATEXT}){{0,31}})"
_ADDRESS_LITERAL = f"\\[(?:{IPV4}|IPv6:{IPV6})\\]"
EMAIL = f"(?:{_DOT_ATOM_LOCAL}|{_QUOTED_LOCAL})@(?:{HOSTNAME}|{_ADDRESS_LITERAL})"

# RFC 6531 internationalised Mailbox: also any non-ASCII character in the local part (dot-atom
# or quoted). A non-ASCII character takes up to 4 octets, so such local parts stop at 15
# characters (60 octets); the domain may be an internationalised host name.
_NON_ASCII = "[\u0080-\ud7ff\ue000-\U0010ffff]"
_U_ATEXT = f"(?:{_ATEXT}|{_NON_ASCII})"
_U_LOCAL = (
    f'(?:{_U_ATEXT}(?:\\.?{_U_ATEXT}){{0,7}}|"(?:{_QTEXT}|{_QUOTED_PAIR}|{_NON_ASCII}){{0,13}}")'
)
IDN_EMAIL = (
    f"(?:{_DOT_ATOM_LOCAL}|{_QUOTED_LOCAL}|{_U_LOCAL})@(?:{IDN_HOSTNAME}|{_ADDRESS_LITERAL})"
)

# RFC 3986 URI and URI-reference (= URI / relative-ref), and RFC 3987 IRIs, which also allow
# the "ucschar" ranges where URIs allow unreserved characters. Hosts: registered names and IP
# literals.
_PCT = f"%{_HEX}{_HEX}"
_ASCII_UNRESERVED_SUBDELIMS = "a-zA-Z0-9\\-._~!$&'()*+,;="
_UCSCHAR = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef\U00010000-\U0001fffd"
_IPRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"


def _uri_grammar(unreserved_subdelims: str, query_private: str = "") -> tuple[str, str]:
    """(absolute URI, URI reference) regexes over the given unreserved + sub-delims class;
    `query_private`: characters also allowed in the query (RFC 3987's iprivate)."""
    plain = f"[{unreserved_subdelims}]"
    pchar = f"(?:{plain}|[:@]|{_PCT})"
    segment = f"{pchar}*"
    userinfo = f"(?:{plain}|:|{_PCT})*@"
    reg_name = f"(?:{plain}|{_PCT})*"
    ip_literal = f"\\[(?:{IPV6}|[vV]{_HEX}+\\.(?:[{_ASCII_UNRESERVED_SUBDELIMS}]|:)+)\\]"
    authority = f"(?:{userinfo})?(?:{reg_name}|{ip_literal})(?::[0-9]*)?"
    query = f"(?:{pchar}|[/?{query_private}])*"
    query_or_fragment = f"(?:\\?{query})?(?:#(?:{pchar}|[/?])*)?"

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
IRI, IRI_REFERENCE = _uri_grammar(_ASCII_UNRESERVED_SUBDELIMS + _UCSCHAR, _IPRIVATE)

# RFC 6570 URI Template: literals (its ASCII set, ucschar, iprivate) and expressions
# {op? var[:n|*], ...}.
_TEMPLATE_LITERAL = f"(?:[a-zA-Z0-9!#$&()*+,\\-./:;=?@_~\\[\\]{_UCSCHAR}{_IPRIVATE}]|{_PCT})"
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

# ECMA-262 regexes, a strict subset: literal characters, '.', escapes of classes (\\d \\w \\s,
# negated, \\cX), classes (also the empty `[]` and `[^]`), each optionally quantified, in groups
# one level deep (capturing, non-capturing, lookahead, lookbehind), with alternatives,
# optionally anchored. Holds '\\', so written through the pattern tree (JSON escapes).
_REGEX_LITERAL = "[a-zA-Z0-9 _,:;'=<>!@%/#&~\\-]"
_REGEX_ESCAPE = "\\\\(?:[dDwWsS]|c[a-zA-Z])"
_REGEX_CLASS = "\\[\\^?(?:[a-zA-Z0-9 _]|a-z|A-Z|0-9|\\\\[dws])*\\]"
_REGEX_QUANTIFIER = "[*+?]?"
_REGEX_ATOM = f"(?:(?:{_REGEX_LITERAL}|\\.|{_REGEX_ESCAPE}|{_REGEX_CLASS}){_REGEX_QUANTIFIER})"
_REGEX_ALTERNATIVES = f"{_REGEX_ATOM}*(?:\\|{_REGEX_ATOM}*)*"
# Groups may be quantified, lookarounds not (ECMA-262 forbids quantified lookbehinds, and
# quantified lookaheads in unicode mode).
_REGEX_GROUP = (
    f"(?:\\((?:\\?:)?{_REGEX_ALTERNATIVES}\\){_REGEX_QUANTIFIER}"
    f"|\\(\\?(?:=|!|<=|<!){_REGEX_ALTERNATIVES}\\))"
)
_REGEX_SEQUENCE = f"(?:{_REGEX_ATOM}|{_REGEX_GROUP})*"
REGEX = f"\\^?{_REGEX_SEQUENCE}(?:\\|{_REGEX_SEQUENCE})*\\$?"

# OpenAPI "byte": padded base64.
BASE64 = "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"

# Formats whose values may hold '"', '\\' or control characters: their regexes describe the
# decoded value and are written through the pattern tree, which adds JSON escapes.
ENCODED_FORMATS = frozenset(
    {"email", "idn-email", "json-pointer", "relative-json-pointer", "regex"}
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
    "uri-reference": URI_REFERENCE,
    "uri-template": URI_TEMPLATE,
    "iri": IRI,
    "iri-reference": IRI_REFERENCE,
    "idn-hostname": IDN_HOSTNAME,
    "idn-email": IDN_EMAIL,
    "ipv6": IPV6,
    "duration": DURATION,
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "regex": REGEX,
    "byte": BASE64,
}
