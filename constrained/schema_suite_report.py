"""Run `json_schema_to_regex` over the JSON-Schema-Test-Suite, or our own corpus, and report.

For every schema the translator accepts, each test instance is serialised compactly
(`json.dumps(separators=(",", ":"))`, with and without `ensure_ascii`) and matched with
`re.fullmatch`. An instance counts as matched when either spelling matches.

The suite's core files expect `format` to be an annotation (2019-09+ default) and its
`optional/format` files expect it asserted, so each is run that way (`assert_formats`).
Our own corpus (`tests/data/schema_corpus.json`: realistic schemas with valid and invalid
instances we wrote) runs with the translator's defaults, as the engine uses it.

- `valid: false` instances must never match: a match is a soundness violation.
- `valid: true` instances should match; the rate is reported (misses come from deliberate
  strict subsets: integers not written as `1.0`, formats without leap seconds, any-value
  nesting depth, recursion depth, ...).

Usage: python -m radixgen.constrained.schema_suite_report [-v] [SUITE_DIR | CORPUS.json ...]
(no argument: the suite's draft2020-12, draft7 and draft4 folders, then our corpus)
"""

from __future__ import annotations

import collections
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from radixgen.constrained.constraint_spec import SchemaTranslation
from radixgen.constrained.json_schema import json_schema_to_regex
from radixgen.constrained.unsupported import UnsatisfiableSchemaError, UnsupportedSchemaError

SUITE_SUBDIR = "draft2020-12"
SUITE_DIALECTS = ("draft2020-12", "draft7", "draft4")
_DIALECT_URIS = {
    "draft4": "http://json-schema.org/draft-04/schema#",
    "draft7": "http://json-schema.org/draft-07/schema#",
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
}
CORPUS_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "schema_corpus.json"


@dataclass
class SuiteReport:
    """Counts over the whole suite."""

    schemas_total: int = 0
    schemas_accepted: int = 0
    valid_total: int = 0
    valid_matched: int = 0
    # valid:true instances of the optional format files (format asserted, strict subsets)
    format_valid_total: int = 0
    format_valid_matched: int = 0
    invalid_total: int = 0
    invalid_rejected: int = 0
    rejected_keywords: collections.Counter = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)  # valid:false instances that matched
    misses: list[str] = field(default_factory=list)  # valid:true instances that did not match
    refusals: list[str] = field(default_factory=list)  # schemas refused, with the reason

    def record_instance(self, label: str, *, valid: bool, matched: bool) -> None:
        """Counts one test instance: a valid one should match, an invalid one must not."""
        if valid:
            self.valid_total += 1
            self.valid_matched += matched
            if not matched:
                self.misses.append(label)
        else:
            self.invalid_total += 1
            self.invalid_rejected += not matched
            if matched:
                self.violations.append(label)

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


def suite_cases(suite_dir: Path) -> Iterator[tuple[str, dict, SchemaTranslation]]:
    """(name, case, translation) for every case of the suite folder, read as the suite means:
    JSON Schema's default for undeclared properties, `format` asserted only in the optional
    format files, and the folder's dialect declared where a schema leaves it implicit."""
    for path in suite_files(suite_dir):
        translation = SchemaTranslation(
            allow_undeclared_properties=True, assert_formats=path.parent.name == "format"
        )
        for case in json.loads(path.read_text(encoding="utf-8")):
            name = f"{path.relative_to(suite_dir)}: {case['description']}"
            schema = case["schema"]
            if isinstance(schema, dict) and "$schema" not in schema:
                # The older drafts' files leave their dialect implicit; a real schema says it.
                schema = {"$schema": _DIALECT_URIS.get(suite_dir.name, ""), **schema}
            yield name, {**case, "schema": schema}, translation


def run_suite(suite_dir: Path, any_value_depth: int = 2) -> SuiteReport:
    """Translate every suite schema and match every instance against the accepted ones.

    `any_value_depth` 1 (instead of the engine's 2) makes the regexes 4x smaller where any value
    is allowed, and Python's `re` compiles them 3x faster; on 2020-12 it matches 7 valid
    instances fewer (uniqueItems=false arrays of arrays and objects).
    """
    report = SuiteReport()
    for name, case, translation in suite_cases(suite_dir):
        options = {**translation.as_options(), "any_value_depth": any_value_depth}
        _run_case(report, name, case, options)
    return report


def corpus_cases(corpus_path: Path = CORPUS_PATH) -> Iterator[tuple[str, dict, SchemaTranslation]]:
    """(name, case, translation) for our own corpus: entries {name, schema, valid: [...],
    invalid: [...]}, translated with the engine's defaults."""
    for entry in json.loads(corpus_path.read_text(encoding="utf-8")):
        tests = [{"data": value, "valid": True, "description": f"valid #{index}"}
                 for index, value in enumerate(entry["valid"])]  # fmt: skip
        tests += [{"data": value, "valid": False, "description": f"invalid #{index}"}
                  for index, value in enumerate(entry["invalid"])]  # fmt: skip
        yield entry["name"], {"schema": entry["schema"], "tests": tests}, SchemaTranslation()


def run_corpus(corpus_path: Path = CORPUS_PATH) -> SuiteReport:
    """Our own corpus through the translator's regex, with the engine's defaults."""
    report = SuiteReport()
    for name, case, translation in corpus_cases(corpus_path):
        _run_case(report, name, case, translation.as_options())
    return report


def _run_case(report: SuiteReport, name: str, case: dict, options: dict) -> None:
    report.schemas_total += 1
    try:
        regex = json_schema_to_regex(case["schema"], **options)
    except UnsatisfiableSchemaError:
        report.rejected_keywords["(no value satisfies it)"] += 1
        return
    except UnsupportedSchemaError as error:
        report.rejected_keywords[error.keyword] += 1
        report.refusals.append(f"{name}: {error}")
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
        report.record_instance(label, valid=test["valid"], matched=matched)
        if test["valid"] and name.startswith("optional/format/"):
            report.format_valid_total += 1
            report.format_valid_matched += matched


def format_report(report: SuiteReport) -> str:
    lines = [
        f"schemas accepted: {report.schemas_accepted} / {report.schemas_total}",
        f"valid:true instances matched: {report.valid_matched} / {report.valid_total}"
        f" ({100 * report.valid_match_rate:.1f}%)",
        f"  of which optional/format: {report.format_valid_matched} / {report.format_valid_total};"
        f" all other files: {report.valid_matched - report.format_valid_matched} /"
        f" {report.valid_total - report.format_valid_total}",
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
    verbose = "-v" in argv
    targets = [Path(arg) for arg in argv if not arg.startswith("-")]
    if not targets:
        repo_root = Path(__file__).resolve().parents[1]
        targets = [find_suite_dir(repo_root, dialect) for dialect in SUITE_DIALECTS]
        if None in targets:
            print("JSON-Schema-Test-Suite not found; pass its draft folders", file=sys.stderr)
            return 2
        targets.append(CORPUS_PATH)
    violations = 0
    for target in targets:
        report = run_corpus(target) if target.suffix == ".json" else run_suite(target)
        print(f"== {target}")
        print(format_report(report))
        if verbose:
            print("\n".join(f"refused: {refusal}" for refusal in report.refusals))
            print("\n".join(f"miss: {miss}" for miss in report.misses))
        violations += len(report.violations)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
