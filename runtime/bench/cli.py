"""`radixgen bench serving|offline|latency|hf`: argument parsing for the benchmark modes.

Each mode's options are generated from its dataclass (`ServingArgs`, `DatasetArgs`,
`LatencyArgs`, `HFBenchArgs`), and the model options of `offline` and `latency` from
`ServerArgs`, so flags never drift from the code that uses them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from radixgen.runtime.bench.datasets import DatasetArgs
from radixgen.runtime.bench.hf_peer import HFBenchArgs
from radixgen.runtime.bench.latency import LatencyArgs
from radixgen.runtime.bench.offline import OfflineArgs
from radixgen.runtime.bench.serving import ServingArgs
from radixgen.runtime.server_args import ServerArgs

# SGLang's spellings of the same flags (bench_serving / bench_one_batch), kept beside ours.
_FLAG_ALIASES = {
    "dataset": ["--dataset-name"],
    "batch_sizes": ["--batch-size"],
}
_FLAG_HELP = {
    "base_url": "server address",
    "host": "server host (replaces base-url's)",
    "port": "server port (replaces base-url's)",
    "backend": "radixgen: the native /generate; openai: /v1/completions (any OpenAI server)",
    "model": "model name for the OpenAI API (default: the server's first)",
    "api_key": "sent as 'Authorization: Bearer KEY'",
    "request_rate": "Poisson arrivals per second (inf: all at once)",
    "max_concurrency": "requests in flight at most (default: unbounded)",
    "seed": "seed of the dataset and of the arrival times",
    "disable_ignore_eos": "let outputs stop at EOS (by default every output has its length)",
    "timeout_s": "per-request timeout in seconds",
    "dataset": "the workload",
    "num_prompts": "requests to send",
    "vocab_size": "random token ids are drawn below this",
    "random_input_len": "random-ids: prompt tokens",
    "random_output_len": "random-ids: output tokens",
    "random_range_ratio": "random-ids: lengths drawn from [ratio * len, len]",
    "gsp_num_groups": "generated-shared-prefix: groups sharing one system prompt",
    "gsp_prompts_per_group": "generated-shared-prefix: questions per group",
    "gsp_system_prompt_len": "generated-shared-prefix: system prompt tokens",
    "gsp_question_len": "generated-shared-prefix: question tokens",
    "gsp_output_len": "generated-shared-prefix: output tokens",
    "num_conversations": "multi-turn: conversations",
    "num_turns": "multi-turn: turns per conversation",
    "turn_input_len": "multi-turn: new tokens per turn",
    "turn_output_len": "multi-turn: output tokens per turn",
    "json_output_len": "json: max output tokens",
    "json_array_items": "json-array: digits per output",
    "dataset_path": "sharegpt: a local ShareGPT-format JSON file (nothing is downloaded)",
    "sharegpt_output_len": "sharegpt: output tokens (default: the reply's characters / 4)",
    "batch_sizes": "batch sizes to measure, one after the other",
    "input_len": "prompt tokens per request",
    "output_len": "output tokens per request",
    "warmup_steps": "decode steps left out of the timing",
}


def _add_dataclass_flags(parser, cls, only=None, skip=(), prefix_dest: str = "") -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if (only is not None and f.name not in only) or f.name in skip:
            continue
        flags = ["--" + f.name.replace("_", "-"), *_FLAG_ALIASES.get(f.name, [])]
        hint = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f"{_FLAG_HELP.get(f.name, '')} (default: {default})".strip()
        common = {"dest": prefix_dest + f.name, "help": help_text}
        origin = typing.get_origin(hint)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if hint is bool or args == [bool]:  # `bool | None`: None is "the default for the device"
            parser.add_argument(*flags, action="store_true", default=default, **common)
        elif origin is typing.Literal or (args and typing.get_origin(args[0]) is typing.Literal):
            choices = typing.get_args(hint if origin is typing.Literal else args[0])
            parser.add_argument(*flags, choices=choices, default=default, **common)
        elif origin is tuple:
            parser.add_argument(*flags, type=int, nargs="+", default=list(default), **common)
        else:
            base = args[0] if args else hint
            convert = base if base in (int, float, str) else str
            parser.add_argument(*flags, type=convert, default=default, **common)


def _add_output_flag(parser) -> None:
    parser.add_argument(
        "--output-json", "--output-file", dest="output_json", default=None,
        help="write the results to this JSON file",
    )  # fmt: skip


def _take(namespace, cls, prefix: str = ""):
    values = {}
    for f in dataclasses.fields(cls):
        if hasattr(namespace, prefix + f.name):
            value = getattr(namespace, prefix + f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


# ServerArgs options that only an HTTP server uses: the in-process modes do not list them.
SERVER_ONLY_FIELDS = frozenset({
    "host", "port", "api_key", "metrics_no_auth", "max_request_bytes", "shutdown_timeout",
    "header_read_timeout", "max_queued_requests", "tool_call_parser", "enable_auto_tool_choice",
    "chat_template", "log_level",
})  # fmt: skip


def _add_engine_flags(parser) -> None:
    """The in-process modes take the `ServerArgs` options of the engine, parsed as `radixgen
    serve` does (not the HTTP server's own)."""
    from radixgen.runtime.cli import add_server_args  # imported late: that module imports this

    add_server_args(parser, skip=SERVER_ONLY_FIELDS)


def _engine_args(namespace) -> ServerArgs:
    from radixgen.runtime.cli import server_args_from_namespace

    return server_args_from_namespace(namespace)


def add_bench_command(subparsers) -> None:
    """`radixgen bench MODE ...`; plugged into `radixgen.runtime.cli`."""
    bench = subparsers.add_parser("bench", help="benchmarks: serving, offline, latency, hf")
    bench.set_defaults(handler=run_bench)
    modes = bench.add_subparsers(dest="bench_mode", required=True)

    serving = modes.add_parser("serving", help="load a running server (radixgen or OpenAI API)")
    _add_dataclass_flags(serving, ServingArgs)
    _add_dataclass_flags(serving, DatasetArgs, skip=("seed",), prefix_dest="dataset_")
    _add_output_flag(serving)

    offline = modes.add_parser("offline", help="the in-process Engine, all prompts at once")
    _add_engine_flags(offline)
    _add_dataclass_flags(offline, DatasetArgs, skip=("seed",), prefix_dest="dataset_")
    _add_dataclass_flags(offline, OfflineArgs)
    _add_output_flag(offline)

    latency = modes.add_parser("latency", help="one static batch: prefill ms, decode ms/token")
    _add_engine_flags(latency)
    _add_dataclass_flags(latency, LatencyArgs, skip=("seed",))
    _add_output_flag(latency)

    hf = modes.add_parser("hf", help="the same workload through transformers' generate")
    _add_dataclass_flags(hf, HFBenchArgs)
    _add_output_flag(hf)


def run_bench(namespace: argparse.Namespace) -> int:
    mode = namespace.bench_mode
    if mode == "serving":
        from radixgen.runtime.bench.serving import main_serving

        dataset = _take(namespace, DatasetArgs, prefix="dataset_")
        serving = _take(namespace, ServingArgs)
        summary = main_serving(
            serving, dataclasses.replace(dataset, seed=serving.seed), namespace.output_json
        )
        if summary["successful_requests"] == 0:
            # Every request failed (wrong URL, missing --api-key...): a script must notice.
            print(f"every request failed; first error: {summary.get('first_error')}")
            return 1
    elif mode == "offline":
        from radixgen.runtime.bench.offline import main_offline

        server_args = _engine_args(namespace)
        dataset = _take(namespace, DatasetArgs, prefix="dataset_")
        main_offline(server_args, dataset, _take(namespace, OfflineArgs), namespace.output_json)
    elif mode == "latency":
        from radixgen.runtime.bench.latency import main_latency

        main_latency(_engine_args(namespace), _take(namespace, LatencyArgs), namespace.output_json)
    elif mode == "hf":
        from radixgen.runtime.bench.hf_peer import main_hf

        main_hf(_take(namespace, HFBenchArgs), namespace.output_json)
    else:  # argparse's `required=True` makes this unreachable from the CLI
        raise ValueError(f"unknown bench mode {mode!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m radixgen.runtime.bench.cli MODE ...` (same as `radixgen bench MODE ...`)."""
    from radixgen.runtime.cli import main as radixgen_main

    return radixgen_main(["bench", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
