"""Run `json_schema_to_regex` over the JSON-Schema-Test-Suite (draft 2020-12) and report.

For every schema the translator accepts, each test instance is serialised compactly
(`json.dumps(separators=(",", ":"))`, with and without `ensure_ascii`) and matched with
`re.fullmatch`. An instance counts as matched when either spelling matches.

- `valid: false` instances must never match: a match is a soundness violation.
- `valid: true` instances should match; the rate is reported (misses come from deliberate
  strict subsets: integers not written as `1.0`, formats without leap seconds, any-value
  nesting depth, recursion depth, ...).

Usage: python -m radixgen.constrained.schema_suite_report [-v] [SUITE_DIR]
"""

from __future__ import annotations

import collections
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from radixgen.constrained.json_schema import json_schema_to_regex
from radixgen.constrained.unsupported import UnsupportedSchemaError

SUITE_SUBDIR = "draft2020-12"
# Translation options for the suite: JSON Schema's own default for undeclared properties.
SUITE_OPTIONS = {"allow_undeclared_properties": True}


@dataclass
class SuiteReport:
    """Counts over the whole suite."""

    schemas_total: int = 0
    schemas_accepted: int = 0
    valid_total: int = 0
    valid_matched: int = 0
    invalid_total: int = 0
    invalid_rejected: int = 0
    rejected_keywords: collections.Counter = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)  # valid:false instances that matched
    misses: list[str] = field(default_factory=list)  # valid:true instances that did not match

    @property
    def valid_match_rate(self) -> float:
        return self.valid_matched / max(self.valid_total, 1)

    @property
    def invalid_rejection_rate(self) -> float:
        return self.invalid_rejected / max(self.invalid_total, 1)


def find_suite_dir(repo_root: Path, subdir: str = SUITE_SUBDIR) -> Path | None:
    """The suite folder in a `shared/data/` beside the checkout or above it, if present."""
    for folder in repo_root.parents:
        candidate = folder / "shared" / "data" / "json-schema-test-suite" / subdir
        if candidate.is_dir():
            return candidate
    return None


def suite_files(suite_dir: Path) -> list[Path]:
    """Core test files, then the optional format files, in a stable order."""
    return sorted(suite_dir.glob("*.json")) + sorted(suite_dir.glob("optional/format/*.json"))


def run_suite(suite_dir: Path) -> SuiteReport:
    """Translate every suite schema and match every instance against the accepted ones."""
    report = SuiteReport()
    for path in suite_files(suite_dir):
        for case in json.loads(path.read_text(encoding="utf-8")):
            _run_case(report, f"{path.relative_to(suite_dir)}: {case['description']}", case)
    return report


def _run_case(report: SuiteReport, name: str, case: dict) -> None:
    report.schemas_total += 1
    try:
        regex = json_schema_to_regex(case["schema"], **SUITE_OPTIONS)
    except UnsupportedSchemaError as error:
        report.rejected_keywords[error.keyword] += 1
        return
    except ValueError:
        report.rejected_keywords["(malformed or unresolvable)"] += 1
        return
    report.schemas_accepted += 1
    compiled = re.compile(regex)
    for test in case["tests"]:
        spellings = {
            json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False),
            json.dumps(test["data"], separators=(",", ":")),
        }
        matched = any(compiled.fullmatch(text) for text in spellings)
        label = f"{name} / {test['description']}"
        if test["valid"]:
            report.valid_total += 1
            report.valid_matched += matched
            if not matched:
                report.misses.append(label)
        else:
            report.invalid_total += 1
            report.invalid_rejected += not matched
            if matched:
                report.violations.append(label)


def format_report(report: SuiteReport) -> str:
    lines = [
        f"schemas accepted: {report.schemas_accepted} / {report.schemas_total}",
        f"valid:true instances matched: {report.valid_matched} / {report.valid_total}"
        f" ({100 * report.valid_match_rate:.1f}%)",
        f"valid:false instances rejected: {report.invalid_rejected} / {report.invalid_total}"
        f" ({100 * report.invalid_rejection_rate:.1f}%)",
        "rejected schemas by keyword:",
    ]
    for keyword, count in report.rejected_keywords.most_common():
        lines.append(f"  {keyword}: {count}")
    for violation in report.violations:
        lines.append(f"VIOLATION (valid:false matched): {violation}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [arg for arg in argv if not arg.startswith("-")]
    if paths:
        suite_dir = Path(paths[0])
    else:
        suite_dir = find_suite_dir(Path(__file__).resolve().parents[1])
    if suite_dir is None or not suite_dir.is_dir():
        print("JSON-Schema-Test-Suite not found; pass its draft2020-12 folder", file=sys.stderr)
        return 2
    report = run_suite(suite_dir)
    print(format_report(report))
    if "-v" in argv:
        print("\n".join(f"miss: {miss}" for miss in report.misses))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
