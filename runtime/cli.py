"""The `radixgen` command line: `radixgen serve ...` (and more subcommands as they land).

The server flags are generated from the `ServerArgs` dataclass, so a new runtime option is a
new flag without touching this file: `chunked_prefill_size` becomes `--chunked-prefill-size`,
a `bool` becomes a `store_true` switch, a `Literal` becomes `choices`.

A subcommand is a function `add_<name>_command(subparsers)` that builds its parser and sets
`handler=` (a function taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Sequence

from radixgen.runtime.bench.cli import add_bench_command
from radixgen.runtime.router.cli import add_router_command
from radixgen.runtime.server_args import ServerArgs

# One-line help for the flags users reach for first; the rest show their default only.
_FLAG_HELP = {
    "lora_paths": "LoRA adapters to load at start-up, 'name=path' each (PEFT folders)",
    "lora_target_modules": "modules the LoRA pool serves: 'all' or q_proj k_proj v_proj o_proj "
    "gate_proj up_proj down_proj (default: the start-up adapters')",
    "max_loras_per_batch": "LoRA adapters on the device at once (the pool's slots)",
    "max_lora_rank": "rank of the LoRA pool (default: the largest start-up adapter's)",
    "tp_size": "tensor parallelism: split every layer over this many processes (GPUs)",
    "dp_size": "data parallelism: this many replicas behind one HTTP front end",
    "routing_policy": "how --dp-size replicas are picked (alias --policy): longest cached "
    "prefix unless load is imbalanced, or round robin",
    "nnodes": "machines the --tp-size ranks spread over",
    "node_rank": "this machine's index among --nnodes (0 serves HTTP)",
    "dist_init_addr": "'host:port' of node 0 for the process group (default: a free local port)",
    "dist_timeout": "seconds a collective waits for a peer before the server stops",
    "disable_custom_all_reduce": "NCCL for every tensor-parallel all-reduce (by default small "
    "messages sum through CUDA peer memory on one node)",
    "model_path": "model folder, or 'tiny' for the project's built-in tiny model",
    "tokenizer_path": "tokenizer folder (default: the model path)",
    "dtype": "weight and activation dtype ('auto': the checkpoint's, float32 on CPU)",
    "load_format": "'dummy' builds random weights from the config (no checkpoint read)",
    "quantization": "'fp8': FP8 (e4m3) weights and activations, quantized at load time from a "
    "bf16/fp16 checkpoint (FP8 checkpoints load as FP8 without it); 'awq'/'gptq' (or vLLM's "
    "'awq_marlin'/'gptq_marlin'): int4 weights (detected from an AWQ/GPTQ checkpoint without "
    "it; a bf16 checkpoint is quantized round-to-nearest, group 128)",
    "disable_fp8_fast_accum": "FP8 GEMMs over 64 tokens accumulate in fp32 throughout, not "
    "through the tensor cores' fast FP8 accumulation (vLLM's and SGLang's default on Hopper)",
    "kv_cache_dtype": "KV cache storage; fp8 (= fp8_e4m3) or fp8_e5m2 hold twice the tokens",
    "quantization_param_path": "FP8 KV cache scales per layer (JSON, SGLang's/vLLM's format; "
    "`radixgen calibrate-kv-cache` writes one) over the checkpoint's",
    "device": "'auto' picks cuda when available, else cpu",
    "context_length": "maximum prompt + output length (default: the model config's)",
    "served_model_name": "model name reported by /v1/models (default: the model path)",
    "mem_fraction_static": "fraction of free GPU memory for weights and the KV cache",
    "max_total_tokens": "number of KV cache slots; overrides --mem-fraction-static",
    "max_running_requests": "cap on requests decoding at once (default: from the KV size)",
    "max_prefill_tokens": "token budget of one prefill batch",
    "chunked_prefill_size": "split prompts longer than this into chunks (<= 0: off)",
    "schedule_policy": "order of the waiting queue",
    "schedule_max_wait_s": "aging bound: a request waiting longer goes first, whatever the policy",
    "new_token_ratio": "decode headroom reserved per running request (fraction of its max tokens)",
    "in_batch_prefix_min_tokens": "a waiting request whose next uncached tokens (at least this "
    "many) an extending request computes waits one batch to find them cached (0: off)",
    "constrained_cache_dir": "also keep compiled constraint indexes in this folder, reused "
    "across restarts (default: in memory only)",
    "enable_mixed_chunk": "running requests decode inside prefill (extend) forwards",
    "enable_overlap_schedule": "launch each decode step before the previous one is processed on "
    "the host (default: on for CUDA)",
    "disable_cuda_graph": "run decode eagerly (CUDA graphs are on by default on CUDA)",
    "cuda_graph_max_bs": "largest decode batch replayed from a CUDA graph",
    "skip_warmup": "report healthy without running warm-up requests first (kernels then "
    "compile inside the first requests)",
    "enable_tree_attention": "decode shared cached prefixes once per group of requests (tree "
    "attention, Triton backend; default: on for CUDA, docs/kernels.md)",
    "constrained_compile_timeout_s": "a regex/JSON-schema compile slower than this fails its "
    "request alone",
    "grammar_backend": "who compiles constraints and computes token masks (llguidance also "
    "takes EBNF/Lark grammars)",
    "enable_jump_forward": "append forced text of constrained outputs without sampling it "
    "(default: on with llguidance, off with outlines)",
    "disable_constraint_budget": "let max_new_tokens cut constrained outputs raw (by default "
    "they end as a complete match)",
    "speculative_algorithm": "speculative decoding: NGRAM (prompt lookup), STANDALONE (a draft "
    "model) or EAGLE (a draft head on the model's hidden states); any case",
    "speculative_num_steps": "tokens drafted per request per step (default 4)",
    "speculative_num_draft_tokens": "tokens per request in a verify forward: num_steps + 1",
    "speculative_eagle_topk": "draft tree width; only 1 (a chain) is supported",
    "speculative_draft_model_path": "the draft model of STANDALONE (same vocabulary as the "
    "model) or the EAGLE head's folder",
    "speculative_ngram_min_match_window_size": "NGRAM: shortest suffix that must match earlier",
    "speculative_ngram_max_match_window_size": "NGRAM: longest suffix tried (longest match wins)",
    "speculative_min_accept_length": "back off (decode plainly for a growing number of steps) "
    "while speculation gains fewer tokens per request per step than this (default 2.0; 0: never)",
    "speculative_max_batch_size": "running batches larger than this decode without speculation "
    "(default: 128 // num_draft_tokens, 25 with the default 4 steps)",
    "chat_template": "a Jinja chat template file that replaces the tokenizer's own",
    "tool_call_parser": "how tool calls are written and parsed on /v1/chat/completions "
    "(hermes = qwen25: <tool_call> blocks; llama3 = llama3_json; mistral: [TOOL_CALLS])",
    "enable_auto_tool_choice": "accepted for vLLM's users: tool_choice 'auto' is always on",
    "seed": "seed of the dummy weights and of unseeded sampling",
    "max_queued_requests": "requests waiting beyond this get HTTP 503",
    "disable_radix_cache": "turn the prefix cache off",
    "attention_backend": "attention implementation (default: triton on CUDA, torch on CPU)",
    "sampling_backend": "sampler: the fused Triton kernel or torch (auto: triton on CUDA)",
    "host": "address to bind (127.0.0.1 keeps the server local)",
    "port": "TCP port of the HTTP server",
    "api_key": "require 'Authorization: Bearer KEY' on every endpoint except /health",
    "metrics_no_auth": "serve /metrics without the API key (for Prometheus scrapers)",
    "log_level": "logging level of every process",
    "max_request_bytes": "request bodies larger than this get HTTP 413",
    "shutdown_timeout": "seconds in-flight requests get to finish after SIGTERM before they are "
    "aborted (new requests get 503 meanwhile)",
    "header_read_timeout": "seconds a connection gets to send its request headers",
}


def flag_name(field_name: str) -> str:
    """`chunked_prefill_size` -> `--chunked-prefill-size`."""
    return "--" + field_name.replace("_", "-")


def _strip_optional(annotation) -> tuple[object, bool]:
    """Returns (the annotation without `None`, whether `None` was allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return members[0], len(members) != len(typing.get_args(annotation))
    return annotation, False


def add_server_args(parser: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """Adds one flag per `ServerArgs` field to `parser` (but the fields in `skip`).

    Every flag defaults to `argparse.SUPPRESS`, so `server_args_from_namespace` only passes
    the options the user gave and the dataclass defaults stay the single source of truth.
    """
    hints = typing.get_type_hints(ServerArgs)
    group = parser.add_argument_group("server options (ServerArgs)")
    for field in dataclasses.fields(ServerArgs):
        if field.name in skip:
            continue
        annotation, optional = _strip_optional(hints[field.name])
        help_text = _FLAG_HELP.get(field.name, "")
        # Help that already explains the default ("default: from the KV size") keeps it.
        default_note = "" if "default" in help_text else f"(default: {field.default})"
        kwargs: dict = {
            "dest": field.name,
            "default": argparse.SUPPRESS,
            "help": f"{help_text} {default_note}".strip(),
        }
        if annotation is bool:
            # A switch, and its opposite for --enable-X / --disable-X pairs (SGLang's users
            # type either), so a default that differs by device can be set both ways.
            kwargs["action"] = "store_true"
            opposite = _opposite_switch(field.name)
            if opposite is not None:
                group.add_argument(
                    flag_name(opposite),
                    dest=field.name,
                    default=argparse.SUPPRESS,
                    action="store_false",
                    help=f"the opposite of {flag_name(field.name)}",
                )
        elif typing.get_origin(annotation) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(annotation))
            kwargs["metavar"] = "{" + ",".join(map(str, kwargs["choices"])) + "}"
        elif annotation in (int, float, str):
            kwargs["type"] = annotation
            kwargs["metavar"] = field.name.upper()
        elif typing.get_origin(annotation) is tuple:  # tuple[str, ...]: space-separated values
            kwargs["nargs"] = "+"
            kwargs["metavar"] = field.name.upper()
        else:
            raise TypeError(
                f"ServerArgs.{field.name} has type {annotation!r}, which the CLI cannot parse; "
                "use bool, int, float, str, a Literal, or one of them | None"
            )
        if optional and "type" in kwargs:
            kwargs["help"] += "; 'none' unsets it"
            kwargs["type"] = _none_or(kwargs["type"])
        group.add_argument(flag_name(field.name), *_FLAG_ALIASES.get(field.name, ()), **kwargs)


# Other projects' names for the same flag (SGLang router's --policy).
_FLAG_ALIASES = {"routing_policy": ("--policy",)}


def _opposite_switch(field_name: str) -> str | None:
    """`enable_x` -> `disable_x` and back; None for other switches."""
    for prefix, other in (("enable_", "disable_"), ("disable_", "enable_")):
        if field_name.startswith(prefix):
            return other + field_name.removeprefix(prefix)
    return None


def _none_or(convert: Callable[[str], object]) -> Callable[[str], object]:
    def parse(text: str) -> object:
        return None if text.lower() == "none" else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def server_args_from_namespace(namespace: argparse.Namespace) -> ServerArgs:
    """Builds `ServerArgs` from the flags the user gave (validated by the dataclass)."""
    given = {
        name: getattr(namespace, name)
        for name in ServerArgs.field_names()
        if hasattr(namespace, name)
    }
    return ServerArgs(**given)


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start the HTTP server (native and OpenAI-compatible APIs)",
        description="Start the radixgen HTTP server: native /generate plus the OpenAI API.",
    )
    add_server_args(parser)
    parser.set_defaults(handler=_run_serve)


def _run_serve(namespace: argparse.Namespace) -> int:
    # Imported here: the server pulls in FastAPI, ZeroMQ and (in its children) torch.
    from radixgen.runtime.server.launch import launch_server

    try:
        server_args = server_args_from_namespace(namespace)
    except (ValueError, TypeError) as error:
        # Bad option values (validated by ServerArgs) read as usage errors, not tracebacks.
        print(f"radixgen serve: error: {error}", file=sys.stderr)
        return 2
    return launch_server(server_args)


def add_calibrate_kv_cache_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate-kv-cache",
        help="measure FP8 KV cache scales on sample prompts (--quantization-param-path file)",
        description="Run sample prompts through the model and write per-layer FP8 KV cache "
        "scales (amax / the format's max) as the JSON --quantization-param-path reads. "
        "--kv-cache-dtype names the FP8 format (default fp8_e4m3); the other server flags "
        "describe the model as it will be served (e.g. --quantization fp8).",
    )
    parser.add_argument("--prompts-file", required=True, help="one prompt per line (.jsonl: "
                        "one JSON string or {\"text\": ...} per line)")  # fmt: skip
    parser.add_argument("--output", required=True, help="the JSON file to write")
    parser.add_argument("--num-prompts", type=int, default=512, help="the file's first N")
    parser.add_argument("--max-prompt-tokens", type=int, default=2048, help="longer: cut")
    add_server_args(parser, skip=frozenset({"quantization_param_path"}))
    parser.set_defaults(handler=_run_calibrate_kv_cache)


def _run_calibrate_kv_cache(namespace: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    name = "radixgen calibrate-kv-cache"
    try:
        server_args = server_args_from_namespace(namespace)
        if server_args.tp_size != 1 or server_args.dp_size != 1:
            raise ValueError("calibration runs on one device: tp_size and dp_size must be 1")
        if namespace.num_prompts < 1 or namespace.max_prompt_tokens < 1:
            raise ValueError("--num-prompts and --max-prompt-tokens must be >= 1")
        texts = read_prompts_file(namespace.prompts_file)[: namespace.num_prompts]
    except (OSError, ValueError, TypeError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    # Imported here: the model runner pulls in torch.
    from radixgen.runtime.kv_calibration import calibrate_kv_cache_scales
    from radixgen.runtime.tiny_model import resolve_model_path
    from radixgen.runtime.tokenizer import load_tokenizer

    target = "fp8_e4m3" if server_args.kv_cache_dtype == "auto" else server_args.kv_cache_dtype
    try:  # a model or tokenizer folder that is missing or wrong: a message, not a traceback
        model_path = resolve_model_path(server_args.model_path)
        tokenizer = load_tokenizer(server_args.tokenizer_path or model_path)
        prompts = [tokenizer.encode(text)[: namespace.max_prompt_tokens] for text in texts]
        scales = calibrate_kv_cache_scales(server_args, prompts, kv_cache_dtype=target)
    except (OSError, ValueError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    model_type = json.loads(Path(model_path, "config.json").read_text()).get("model_type")
    Path(namespace.output).write_text(json.dumps(scales.to_json(model_type), indent=1) + "\n")
    tokens = sum(len(prompt) for prompt in prompts)
    print(f"wrote {namespace.output}: {len(scales.layers)} layers, {len(prompts)} prompts, "
          f"{tokens} tokens, {scales.dtype}")  # fmt: skip
    return 0


def read_prompts_file(path: str) -> list[str]:
    """The non-empty prompts of a text file (one per line) or a .jsonl file (a JSON string or
    an object with "text" per line). Raises ValueError naming the line."""
    import json
    from pathlib import Path

    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        if not path.endswith(".jsonl"):
            prompts.append(line)
            continue
        try:
            item = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from error
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise ValueError(f'{path}:{number}: expected a string or {{"text": ...}}')
        prompts.append(text)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixgen", description="radixgen: a structured-generation LLM runtime."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_command(subparsers)
    add_bench_command(subparsers)
    add_router_command(subparsers)
    add_calibrate_kv_cache_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `radixgen` console script; returns the process exit code."""
    parser = build_parser()
    namespace = parser.parse_args(argv)
    return namespace.handler(namespace)


if __name__ == "__main__":
    sys.exit(main())
