"""Our own corpus of realistic schemas (tests/data/schema_corpus.json) against the translator.

Kubernetes-like objects with x-kubernetes-* extensions, GitHub-workflow-like configs with
oneOf/patternProperties, MCP tool input schemas, pydantic models with discriminated unions,
older drafts, OpenAPI components and vendor annotation keys; each with valid and invalid
instances we wrote. Hard rule: no invalid instance matches an accepted schema. The instances'
labels are checked with `jsonschema` first, so the corpus itself cannot drift.
"""

from __future__ import annotations

import functools
import json

import jsonschema
import pytest

from radixgen.constrained.schema_suite_report import CORPUS_PATH, SuiteReport, run_corpus

# Measured: see docs/constrained.md. Floors a little below.
MIN_SCHEMAS = 100
MIN_ACCEPTED_SHARE = 0.95
MIN_VALID_MATCH_RATE = 0.97


@functools.lru_cache(maxsize=1)
def corpus() -> list[dict]:
    return json.loads(CORPUS_PATH.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def corpus_report() -> SuiteReport:
    return run_corpus(CORPUS_PATH)


@pytest.mark.parametrize("entry", corpus(), ids=lambda entry: entry["name"])
def test_labels_agree_with_jsonschema(entry):
    validator_class = jsonschema.validators.validator_for(
        entry["schema"], default=jsonschema.Draft202012Validator
    )
    validator = validator_class(entry["schema"], format_checker=jsonschema.FormatChecker())
    for value in entry["valid"]:
        assert validator.is_valid(value), value
    for value in entry["invalid"]:
        assert not validator.is_valid(value), value


def test_no_invalid_instance_matches_an_accepted_schema():
    report = corpus_report()
    assert report.schemas_total == len(corpus()) >= MIN_SCHEMAS
    assert report.invalid_total >= 2 * MIN_SCHEMAS
    assert report.violations == []


def test_corpus_is_accepted_and_matched_at_the_measured_rates():
    report = corpus_report()
    assert report.schemas_accepted >= MIN_ACCEPTED_SHARE * report.schemas_total, report.refusals
    assert report.valid_match_rate >= MIN_VALID_MATCH_RATE, report.misses
    categories = {entry["name"].split("/")[0] for entry in corpus()}
    assert {"k8s", "gha", "mcp", "pydantic"} <= categories
