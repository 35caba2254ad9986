"""The JSON-Schema-Test-Suite through the engine's real compile path, per grammar backend.

`schema_suite_report` checks the translator's regex with Python's `re`; this report compiles
every suite schema with `compile_constraint(json_schema=..., backend=...)` (the 256-byte
vocabulary, the engine's default translation options) and runs each instance through the
compiled matcher, so it also covers what only a backend adds: llguidance's Lark grammars for
recursive schemas, outlines-core's token automaton.

    .venv/bin/python -m radixgen.constrained.backend_suite_report [--backend llguidance] [-v] [DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from radixgen.constrained.checker import compile_constraint
from radixgen.constrained.grammar_interface import GRAMMAR_BACKEND_NAMES
from radixgen.constrained.schema_suite_report import SuiteReport, find_suite_dir, suite_files
from radixgen.constrained.unsupported import UnsupportedSchemaError


def run_backend_suite(
    suite_dir: Path, backend: str, *, select: Callable[[object], bool] | None = None
) -> SuiteReport:
    """Compiles every suite schema (those `select` keeps) on `backend` and checks instances."""
    report = SuiteReport()
    for path in suite_files(suite_dir):
        for case in json.loads(path.read_text(encoding="utf-8")):
            if select is not None and not select(case["schema"]):
                continue
            name = f"{path.relative_to(suite_dir)}: {case['description']}"
            _run_case(report, name, case, backend)
    return report


def _run_case(report: SuiteReport, name: str, case: dict, backend: str) -> None:
    report.schemas_total += 1
    try:
        checker = compile_constraint(json_schema=case["schema"], backend=backend)
    except UnsupportedSchemaError as error:
        report.rejected_keywords[error.keyword] += 1
        return
    except (ValueError, TypeError):
        report.rejected_keywords["(malformed, unresolvable or empty)"] += 1
        return
    report.schemas_accepted += 1
    for test in case["tests"]:
        spellings = {
            json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False),
            json.dumps(test["data"], separators=(",", ":")),
        }
        matched = any(checker.fullmatch(text) for text in spellings)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=GRAMMAR_BACKEND_NAMES, action="append")
    parser.add_argument("-v", action="store_true", help="list the missed valid instances")
    parser.add_argument("suite_dir", nargs="?", type=Path, help="the draft2020-12 folder")
    args = parser.parse_args(argv)
    suite_dir = args.suite_dir or find_suite_dir(Path(__file__).resolve().parents[1])
    if suite_dir is None or not suite_dir.is_dir():
        print("JSON-Schema-Test-Suite not found beside the checkout", file=sys.stderr)
        return 2
    violations = 0
    for backend in args.backend or GRAMMAR_BACKEND_NAMES:
        report = run_backend_suite(suite_dir, backend)
        print(
            f"{backend}: schemas accepted {report.schemas_accepted} / {report.schemas_total}; "
            f"valid:true matched {report.valid_matched} / {report.valid_total} "
            f"({100 * report.valid_match_rate:.1f}%); valid:false rejected "
            f"{report.invalid_rejected} / {report.invalid_total}"
        )
        for violation in report.violations:
            print(f"VIOLATION (valid:false accepted): {violation}")
        if args.v:
            print("\n".join(f"miss: {miss}" for miss in report.misses))
        violations += len(report.violations)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
