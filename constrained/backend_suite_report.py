"""The JSON-Schema-Test-Suite through the engine's real compile path, per grammar backend.

`schema_suite_report` checks the translator's regex with Python's `re`; this report compiles
every suite schema with `compile_constraint(json_schema=..., backend=...)` (the 256-byte
vocabulary; the suite's semantics as in `schema_suite_report.suite_cases`: undeclared
properties allowed, `format` asserted only in the format files) and runs each instance through
the compiled matcher, so it also covers what only a backend adds: llguidance's Lark grammars for
recursive schemas, outlines-core's token automaton. With `--deadline-s`, each schema compiles in
a worker process and one past the deadline counts as refused, as the engine's compile timeout
would fail its request (outlines-core takes minutes on some suite schemas).

    .venv/bin/python -m radixgen.constrained.backend_suite_report [--backend B] [--deadline-s S]
        [--corpus] [-v] [DIR]

`--corpus`: our own corpus (`tests/data/schema_corpus.json`) instead, with the engine's own
translation defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from radixgen.constrained.checker import compile_constraint
from radixgen.constrained.constraint_spec import SchemaTranslation
from radixgen.constrained.deadline_worker import DeadlineWorker
from radixgen.constrained.grammar_interface import GRAMMAR_BACKEND_NAMES
from radixgen.constrained.schema_suite_report import (
    CORPUS_PATH,
    SuiteReport,
    corpus_cases,
    find_suite_dir,
    suite_cases,
)
from radixgen.constrained.unsupported import UnsupportedSchemaError


def run_backend_suite(
    suite_dir: Path,
    backend: str,
    *,
    select: Callable[[object, SchemaTranslation], bool] | None = None,
    deadline_s: float | None = None,
) -> SuiteReport:
    """Compiles every suite schema (those `select` keeps) on `backend` and checks instances;
    with `deadline_s`, in a worker process, a compile past it counting as refused."""
    return run_backend_cases(suite_cases(suite_dir), backend, select=select, deadline_s=deadline_s)


def run_backend_cases(
    cases: Iterable[tuple[str, dict, SchemaTranslation]],
    backend: str,
    *,
    select: Callable[[object, SchemaTranslation], bool] | None = None,
    deadline_s: float | None = None,
) -> SuiteReport:
    """`run_backend_suite` over any (name, case, translation) cases, e.g. `corpus_cases()`."""
    report = SuiteReport()
    worker = None if deadline_s is None else DeadlineWorker(no_worker_state, check_case)
    try:
        for name, case, translation in cases:
            if select is not None and not select(case["schema"], translation):
                continue
            spellings = [_spellings(test["data"]) for test in case["tests"]]
            job = (backend, case["schema"], translation, spellings)
            if worker is None:
                verdict = check_case(None, job)
            else:
                finished, verdict = worker.run(job, deadline_s=deadline_s)
                verdict = verdict if finished else f"(compile past {deadline_s:g} s)"
            _record(report, name, case, verdict)
    finally:
        if worker is not None:
            worker.stop()
    return report


def no_worker_state() -> None:
    """The suite worker needs no state: `compile_constraint` loads its vocabulary once."""
    return None


def check_case(
    _state, job: tuple[str, object, SchemaTranslation, list[set[str]]]
) -> list[bool] | str:
    """Whether any spelling of each instance fullmatches; or why the schema is refused."""
    backend, schema, translation, spellings_per_test = job
    try:
        checker = compile_constraint(
            json_schema=schema, backend=backend, schema_translation=translation
        )
    except UnsupportedSchemaError as error:
        return error.keyword
    except (ValueError, TypeError):
        return "(malformed, unresolvable or empty)"
    return [any(checker.fullmatch(text) for text in spellings) for spellings in spellings_per_test]


def _spellings(instance: object) -> set[str]:
    return {
        json.dumps(instance, separators=(",", ":"), ensure_ascii=False),
        json.dumps(instance, separators=(",", ":")),
    }


def _record(report: SuiteReport, name: str, case: dict, verdict: list[bool] | str) -> None:
    report.schemas_total += 1
    if isinstance(verdict, str):
        report.rejected_keywords[verdict] += 1
        report.refusals.append(f"{name}: {verdict}")
        return
    report.schemas_accepted += 1
    for test, matched in zip(case["tests"], verdict, strict=True):
        label = f"{name} / {test['description']}"
        report.record_instance(label, valid=test["valid"], matched=matched)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=GRAMMAR_BACKEND_NAMES, action="append")
    parser.add_argument("--deadline-s", type=float, help="per schema compile, in a worker")
    parser.add_argument("-v", action="store_true", help="list the missed valid instances")
    parser.add_argument("--corpus", action="store_true", help="our own corpus, not the suite")
    parser.add_argument("suite_dir", nargs="?", type=Path, help="the draft2020-12 folder")
    args = parser.parse_args(argv)
    suite_dir = args.suite_dir or find_suite_dir(Path(__file__).resolve().parents[1])
    if not args.corpus and (suite_dir is None or not suite_dir.is_dir()):
        print("JSON-Schema-Test-Suite not found beside the checkout", file=sys.stderr)
        return 2
    violations = 0
    for backend in args.backend or GRAMMAR_BACKEND_NAMES:
        cases = corpus_cases(CORPUS_PATH) if args.corpus else suite_cases(suite_dir)
        report = run_backend_cases(cases, backend, deadline_s=args.deadline_s)
        print(
            f"{backend}: schemas accepted {report.schemas_accepted} / {report.schemas_total}; "
            f"valid:true matched {report.valid_matched} / {report.valid_total} "
            f"({100 * report.valid_match_rate:.1f}%); valid:false rejected "
            f"{report.invalid_rejected} / {report.invalid_total}"
        )
        timeouts = sum(n for k, n in report.rejected_keywords.items() if k.startswith("(compile"))
        if timeouts:
            print(f"  ({timeouts} schemas refused for compiling past {args.deadline_s:g} s)")
        for violation in report.violations:
            print(f"VIOLATION (valid:false accepted): {violation}")
        if args.v:
            print("\n".join(f"refused: {refusal}" for refusal in report.refusals))
            print("\n".join(f"miss: {miss}" for miss in report.misses))
        violations += len(report.violations)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
