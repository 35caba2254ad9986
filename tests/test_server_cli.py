"""`radixgen serve` flags are generated from ServerArgs: every field, the right kinds."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from radixgen.runtime.cli import build_parser, flag_name, server_args_from_namespace
from radixgen.runtime.server_args import ServerArgs


def parse_serve(*flags: str) -> ServerArgs:
    return server_args_from_namespace(build_parser().parse_args(["serve", *flags]))


def test_every_server_args_field_has_a_flag():
    serve_parser = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {option for action in serve_parser._actions for option in action.option_strings}
    for field in dataclasses.fields(ServerArgs):
        assert flag_name(field.name) in flags


def test_no_flags_gives_the_dataclass_defaults():
    assert parse_serve() == ServerArgs()


def test_flags_parse_to_typed_fields():
    args = parse_serve(
        "--model-path", "tiny",
        "--port", "31000",
        "--mem-fraction-static", "0.5",
        "--disable-radix-cache",
        "--schedule-policy", "fcfs",
        "--attention-backend", "torch",
        "--max-running-requests", "8",
        "--chunked-prefill-size", "none",
        "--api-key", "secret",
    )  # fmt: skip
    assert args.port == 31000 and args.mem_fraction_static == 0.5
    assert args.disable_radix_cache is True
    assert args.schedule_policy == "fcfs" and args.attention_backend == "torch"
    assert args.max_running_requests == 8
    assert args.chunked_prefill_size is None
    assert args.api_key == "secret"
    assert args.host == "127.0.0.1"  # local by default


@pytest.mark.parametrize(
    "flags",
    [["--schedule-policy", "random"], ["--port", "eighty"], ["--dtype", "int3"]],
)
def test_bad_flag_values_are_usage_errors(flags, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", *flags])
    assert exit_info.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_value_rejected_by_server_args_exits_2_with_its_message():
    # Range checks live in ServerArgs.__post_init__; the CLI reports them without a traceback.
    result = subprocess.run(
        [sys.executable, "-m", "radixgen.runtime.server", "--mem-fraction-static", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "mem_fraction_static" in result.stderr
    assert "Traceback" not in result.stderr
