"""`radixgen serve` flags are generated from ServerArgs: every field, the right kinds."""

from __future__ import annotations

import dataclasses
import os
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


def test_jump_forward_defaults_on_with_llguidance_only():
    assert parse_serve().jump_forward  # llguidance, the default backend
    assert not parse_serve("--grammar-backend", "outlines").jump_forward
    assert parse_serve("--grammar-backend", "outlines", "--enable-jump-forward").jump_forward
    assert not parse_serve("--disable-jump-forward").jump_forward


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


def test_every_enable_flag_has_a_disable_flag_and_back():
    serve_parser = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {option for action in serve_parser._actions for option in action.option_strings}
    for flag in flags:
        for prefix, other in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
            if flag.startswith(prefix):
                assert other + flag.removeprefix(prefix) in flags, flag
    assert parse_serve("--disable-overlap-schedule").enable_overlap_schedule is False
    assert parse_serve("--enable-overlap-schedule").enable_overlap_schedule is True
    assert parse_serve("--enable-radix-cache").disable_radix_cache is False
    # The last of a pair wins, as argparse reads them in order.
    assert parse_serve("--disable-radix-cache", "--enable-radix-cache").disable_radix_cache is False
    for action in serve_parser._actions:
        if action.option_strings and action.dest != "help":
            # Every flag says what it does, beyond its default.
            assert action.help and not action.help.startswith("(default"), action.option_strings


def test_tool_call_parser_takes_sglang_and_vllm_names():
    for name in ("hermes", "qwen25", "llama3", "llama3_json", "mistral"):
        assert parse_serve("--tool-call-parser", name).tool_call_parser == name
    assert parse_serve("--enable-auto-tool-choice").enable_auto_tool_choice is True


def test_hub_ids_resolve_from_the_local_cache_only(tmp_path, monkeypatch):
    from radixgen.runtime.tiny_model import resolve_model_path

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snapshot = tmp_path / "models--acme--coder-1b" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--acme--coder-1b" / "refs").mkdir()
    (tmp_path / "models--acme--coder-1b" / "refs" / "main").write_text("0123abc")
    assert resolve_model_path("acme/coder-1b") == str(snapshot)
    with pytest.raises(FileNotFoundError, match="local Hugging Face cache only"):
        resolve_model_path("acme/missing-7b")
    result = subprocess.run(
        [sys.executable, "-m", "radixgen.runtime.server", "--model-path", "acme/missing-7b"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_HUB_CACHE": str(tmp_path)},
    )
    assert result.returncode == 1
    assert "--model-path /path/to/checkpoint-folder" in result.stderr, result.stderr
