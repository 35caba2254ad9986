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


def _add_dataclass_flags(parser, cls, only=None, skip=(), prefix_dest: str = "") -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if (only is not None and f.name not in only) or f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        dest = prefix_dest + f.name
        origin = typing.get_origin(hint)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if hint is bool or args == [bool]:  # `bool | None`: None is "the default for the device"
            parser.add_argument(flag, dest=dest, action="store_true", default=default)
        elif origin is typing.Literal or (args and typing.get_origin(args[0]) is typing.Literal):
            choices = typing.get_args(hint if origin is typing.Literal else args[0])
            parser.add_argument(flag, dest=dest, choices=choices, default=default)
        elif origin is tuple:
            parser.add_argument(flag, dest=dest, type=int, nargs="+", default=list(default))
        else:
            base = args[0] if args else hint
            convert = base if base in (int, float, str) else str
            parser.add_argument(flag, dest=dest, type=convert, default=default)


def _take(namespace, cls, prefix: str = ""):
    values = {}
    for f in dataclasses.fields(cls):
        if hasattr(namespace, prefix + f.name):
            value = getattr(namespace, prefix + f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def _add_engine_flags(parser) -> None:
    """The in-process modes take every `ServerArgs` option, parsed as `radixgen serve` does."""
    from radixgen.runtime.cli import add_server_args  # imported late: that module imports this

    add_server_args(parser)


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
    serving.add_argument("--output-json", default=None)

    offline = modes.add_parser("offline", help="the in-process Engine, all prompts at once")
    _add_engine_flags(offline)
    _add_dataclass_flags(offline, DatasetArgs, skip=("seed",), prefix_dest="dataset_")
    _add_dataclass_flags(offline, OfflineArgs)
    offline.add_argument("--output-json", default=None)

    latency = modes.add_parser("latency", help="one static batch: prefill ms, decode ms/token")
    _add_engine_flags(latency)
    _add_dataclass_flags(latency, LatencyArgs, skip=("seed",))
    latency.add_argument("--output-json", default=None)

    hf = modes.add_parser("hf", help="the same workload through transformers' generate")
    _add_dataclass_flags(hf, HFBenchArgs)
    hf.add_argument("--output-json", default=None)


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
