"""`ServerArgs`: every runtime option, shared by `Engine`, the CLI and the server.

Field names are the CLI flags in snake_case (`--chunked-prefill-size` is
`chunked_prefill_size`). The dataclass is frozen: sizes derived at start-up (KV slots,
context length) live in the runtime's own objects, never written back here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from radixgen.runtime.speculative.config import resolve_speculative_config

DType = Literal["auto", "float32", "float16", "bfloat16"]
LoadFormat = Literal["auto", "safetensors", "dummy"]
SchedulePolicy = Literal["lpm", "dfs-weight", "fcfs"]
AttentionBackendName = Literal["torch", "triton"]
# Mirrors radixgen.runtime.models.quantization.QuantizationName (kept import-free here).
Quantization = Literal["fp8", "awq", "gptq", "awq_marlin", "gptq_marlin"]
# "fp8" is e4m3 (as in vLLM and SGLang); "auto": the model dtype.
KVCacheDType = Literal["auto", "fp8_e4m3", "fp8", "fp8_e5m2"]
SamplingBackendName = Literal["auto", "torch", "triton"]
# Mirrors radixgen.constrained.grammar_interface.GrammarBackendName (kept import-free here).
GrammarBackendName = Literal["llguidance", "outlines"]
# runtime/server/tool_parsers.py's formats, under SGLang's and vLLM's names.
ToolCallParserName = Literal["hermes", "qwen25", "llama3", "llama3_json", "mistral"]
# Data-parallel routing (runtime/router): SGLang router's policy names.
RoutingPolicy = Literal["cache_aware", "round_robin"]


@dataclass(frozen=True)
class ServerArgs:
    # Model
    model_path: str = "tiny"
    tokenizer_path: str | None = None
    dtype: DType = "auto"
    load_format: LoadFormat = "auto"
    device: str = "auto"  # "auto": cuda if available, else cpu
    context_length: int | None = None  # None: from the model config
    seed: int = 0
    served_model_name: str | None = None
    # "fp8": W8A8 e4m3 linear layers (a bf16/fp16 checkpoint is quantized at load time);
    # "awq"/"gptq" (aliases "awq_marlin"/"gptq_marlin"): int4 weight-only; detected from an
    # AWQ/GPTQ checkpoint without it, round-to-nearest group-128 int4 of a bf16 one with it;
    # None: the checkpoint as stored (FP8 checkpoints load as FP8). docs/quantization.md.
    quantization: Quantization | None = None
    # FP8 layers' GEMMs over 64 tokens accumulate each K block in the tensor cores' own
    # precision (cuBLASLt's fast accumulation, as vLLM's and SGLang's Hopper FP8 GEMMs do);
    # this turns it off (fp32 accumulation throughout). docs/quantization.md.
    disable_fp8_fast_accum: bool = False
    # KV cache storage: FP8 halves its bytes (twice the tokens in the same memory).
    kv_cache_dtype: KVCacheDType = "auto"
    # FP8 KV cache scales per layer from a JSON file (SGLang's and vLLM's format; written by
    # `radixgen calibrate-kv-cache`), over the checkpoint's k_scale/v_scale. docs/quantization.md.
    quantization_param_path: str | None = None

    # LoRA adapters (docs/lora.md): on when lora_paths or lora_target_modules is given.
    lora_paths: tuple[str, ...] = ()  # "name=path" PEFT folders loaded at start-up
    max_loras_per_batch: int = 8  # adapters on the device at once (pool slots)
    max_lora_rank: int | None = None  # None: the largest start-up adapter's rank
    # PEFT module names the pool serves ("all": q/k/v/o/gate/up/down); None: the start-up
    # adapters' targets. Adapters loaded later must fit in them.
    lora_target_modules: tuple[str, ...] | None = None

    # Memory
    mem_fraction_static: float = 0.85  # of free GPU memory, for weights already loaded + KV
    max_total_tokens: int | None = None  # KV slots; overrides mem_fraction_static
    max_running_requests: int | None = None  # None: derived from the KV size

    # Scheduling
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192  # None or <= 0: no chunking
    schedule_policy: SchedulePolicy = "lpm"
    schedule_max_wait_s: float = 5.0  # aging bound: older waiting requests go first
    new_token_ratio: float = 0.5  # decode headroom reserved per running request, as a
    # fraction of its remaining max_new_tokens
    max_queued_requests: int = 4096
    # A waiting request whose next uncached tokens (at least this many) are computed by a
    # request already in the extend batch waits for the next batch, to find them in the
    # cache (InBatchPrefixIndex, runtime/batch_builder.py). 0: off.
    in_batch_prefix_min_tokens: int = 32
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False  # running requests decode inside extend forwards
    # Launch each decode step before the previous one's tokens are processed on the host
    # (runtime/overlap_decode.py). None: on for CUDA, off on CPU (nothing to overlap there).
    enable_overlap_schedule: bool | None = None

    # Kernels
    attention_backend: AttentionBackendName | None = None  # None: triton on CUDA, torch on CPU
    disable_cuda_graph: bool = False
    # Tree (cascade) decode attention: requests sharing a cached prefix of >= 64 tokens read its
    # KV once per decode step (kernels/tree_decode_attention.py), with the Triton backend.
    # None: on for CUDA (H200, eleventh session: generated-shared-prefix 33.8 -> 24.0 s, no
    # change where nothing is shared), off on the CPU (the interpreter only tests it).
    enable_tree_attention: bool | None = None
    # Decode batches up to this size replay CUDA graphs (capped by max_running_requests).
    # Above 256 an eager decode step costs ~17 ms more (measured, H200, 8B at batch 1000).
    cuda_graph_max_bs: int = 1024
    # Start-up runs short requests of several shapes first (runtime/warmup.py), so Triton
    # kernels compile before the first user's request; tests skip it.
    skip_warmup: bool = False
    # "auto": the fused Triton sampling kernel on CUDA (kernels/fused_sampling.py), torch on CPU.
    sampling_backend: SamplingBackendName = "auto"

    # Constrained decoding
    constrained_compile_timeout_s: float = 30.0
    # llguidance: masks computed lazily from a token trie, ~1 ms compiles and EBNF/Lark
    # grammars; outlines: outlines-core automata built per constraint (docs/constrained.md).
    grammar_backend: GrammarBackendName = "llguidance"
    # None: on with llguidance (on the H200, key-heavy JSON, 2026-12-01: 1.75x output tokens/s
    # at concurrency 1, 1.74x at 64; its runs ride inside the next decode batch), off with
    # outlines (whose plans may retract a token, so its requests would lose the overlapped
    # schedule; not measured). Outputs are identical either way.
    enable_jump_forward: bool | None = None
    # Compiled constraint indexes are also stored in this folder and reused across restarts
    # (constrained/compile_cache.py, DiskCache). None: in memory only.
    constrained_cache_dir: str | None = None
    # Budget-aware masks keep constrained outputs cut by max_new_tokens a complete match
    # (constrained/completion_budget.py); disabling skips their per-grammar table build too.
    disable_constraint_budget: bool = False

    # Speculative decoding (SGLang's flags; runtime/speculative/, docs/engine.md): NGRAM,
    # STANDALONE and EAGLE (chains); with topk 1, num_draft_tokens = num_steps + 1.
    speculative_algorithm: str | None = None  # NGRAM, STANDALONE or EAGLE, any case
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None  # None: from num_draft_tokens, else 4
    speculative_eagle_topk: int | None = None  # only 1 (a chain)
    speculative_num_draft_tokens: int | None = None  # None: num_steps + 1
    # Running batches above this size decode without speculation. None: 128 // num_draft_tokens.
    speculative_max_batch_size: int | None = None
    # Speculation backs off while its mean accept length stays below this. None: 2.0; 0: never.
    speculative_min_accept_length: float | None = None
    speculative_ngram_min_match_window_size: int = 1
    speculative_ngram_max_match_window_size: int = 12

    # Chat and tools
    chat_template: str | None = None  # a Jinja file that replaces the tokenizer's template
    tool_call_parser: ToolCallParserName = "hermes"
    # vLLM's flag, accepted for its users: tool_choice "auto" is always on here.
    enable_auto_tool_choice: bool = False

    # Parallelism (docs/distributed.md). Tensor parallel: every layer split over tp_size
    # processes (one GPU each); rank 0 schedules and the others follow its batches.
    tp_size: int = 1
    # Data parallel: dp_size independent replicas (each of tp_size ranks) behind one front end.
    dp_size: int = 1
    # How replicas are chosen (runtime/router): longest cached prefix unless load is skewed.
    routing_policy: RoutingPolicy = "cache_aware"
    # Multi-node TP (SGLang's flags): tp_size ranks spread evenly over nnodes machines; node 0
    # serves HTTP, the others only run their ranks. dist_init_addr is "host:port" of node 0.
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    # Seconds a collective waits for a dead or stuck peer before it raises.
    dist_timeout: float = 300.0
    # NCCL for every tensor-parallel all-reduce, not the small-message one over CUDA peer
    # memory (runtime/peer_all_reduce.py; single-node runs only). SGLang's flag.
    disable_custom_all_reduce: bool = False

    # Server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    metrics_no_auth: bool = False  # /metrics without the API key (for scrapers)
    log_level: str = "info"
    # Request bodies above this many bytes get HTTP 413 before they are parsed.
    max_request_bytes: int = 8 * 1024 * 1024
    # On SIGTERM/SIGINT: seconds in-flight requests get to finish before they are aborted.
    shutdown_timeout: float = 30.0
    # Seconds a connection gets to send a complete request head (slowloris guard).
    header_read_timeout: float = 10.0

    @property
    def jump_forward(self) -> bool:
        """`enable_jump_forward` resolved (None: on with the llguidance backend)."""
        if self.enable_jump_forward is None:
            return self.grammar_backend == "llguidance"
        return self.enable_jump_forward

    def __post_init__(self):
        # Lists from Engine kwargs or the CLI become tuples (the dataclass stays hashable).
        for name in ("lora_paths", "lora_target_modules"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"{name} must be a list of strings, got the string {value!r}")
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        parse_lora_paths(self.lora_paths)  # "name=path" entries, distinct names
        if self.max_loras_per_batch < 1:
            raise ValueError(f"max_loras_per_batch must be >= 1, got {self.max_loras_per_batch}")
        if self.max_lora_rank is not None and not 1 <= self.max_lora_rank <= 64:
            raise ValueError(f"max_lora_rank must be in [1, 64], got {self.max_lora_rank}")
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        for name in ("max_total_tokens", "max_running_requests", "context_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.in_batch_prefix_min_tokens < 0:
            raise ValueError(
                f"in_batch_prefix_min_tokens must be >= 0, got {self.in_batch_prefix_min_tokens}"
            )
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        for name in ("shutdown_timeout", "header_read_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        self._check_parallelism()
        if self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        choices = {
            "dtype": DType,
            "load_format": LoadFormat,
            "schedule_policy": SchedulePolicy,
            "sampling_backend": SamplingBackendName,
            "grammar_backend": GrammarBackendName,
            "kv_cache_dtype": KVCacheDType,
            "tool_call_parser": ToolCallParserName,
            "routing_policy": RoutingPolicy,
        }
        for name, literal in choices.items():
            allowed = literal.__args__
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.quantization not in (None, *Quantization.__args__):
            raise ValueError(
                f"quantization must be None or one of {Quantization.__args__}, "
                f"got {self.quantization!r}"
            )
        if self.quantization_param_path is not None and self.kv_cache_dtype == "auto":
            raise ValueError(
                "quantization_param_path holds FP8 KV cache scales: it needs kv_cache_dtype "
                "'fp8_e4m3' (or 'fp8') or 'fp8_e5m2', got 'auto'"
            )
        if self.attention_backend not in (None, *AttentionBackendName.__args__):
            raise ValueError(
                f"attention_backend must be one of {AttentionBackendName.__args__}, "
                f"got {self.attention_backend!r}"
            )

        resolve_speculative_config(self)  # raises ValueError naming the flag

    def _check_parallelism(self) -> None:
        for name in ("tp_size", "dp_size", "nnodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"node_rank must be in [0, nnodes={self.nnodes}), got {self.node_rank}"
            )
        if self.tp_size % self.nnodes:
            raise ValueError(
                f"tp_size ({self.tp_size}) must be a multiple of nnodes ({self.nnodes})"
            )
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ValueError("dist_init_addr ('host:port' of node 0) is required when nnodes > 1")
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"dist_init_addr must be 'host:port', got {self.dist_init_addr!r}")
        if self.dp_size > 1 and self.nnodes > 1:
            raise ValueError("dp_size > 1 runs on one node; use `radixgen router` across nodes")
        if not self.dist_timeout > 0:
            raise ValueError(f"dist_timeout must be > 0 seconds, got {self.dist_timeout}")

    @property
    def tp_ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_kwargs(cls, **kwargs) -> ServerArgs:
        """Builds ServerArgs, naming any unknown option."""
        unknown = set(kwargs) - cls.field_names()
        if unknown:
            raise TypeError(f"unknown server option(s): {sorted(unknown)}")
        return cls(**kwargs)

    @property
    def lora_adapter_paths(self) -> dict[str, str]:
        """The start-up adapters: name -> folder."""
        return parse_lora_paths(self.lora_paths)

    @property
    def lora_enabled(self) -> bool:
        return bool(self.lora_paths) or self.lora_target_modules is not None

    @property
    def effective_chunked_prefill_size(self) -> int | None:
        size = self.chunked_prefill_size
        return size if size is not None and size > 0 else None


def parse_lora_paths(entries: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`["name=path", ...]` (or a bare path, named after its folder) -> {name: path}.

    Raises:
        ValueError: an empty name or path, or a name given twice.
    """
    parsed: dict[str, str] = {}
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep:
            name, path = entry.rstrip("/").rsplit("/", 1)[-1], entry
        if not name or not path:
            raise ValueError(f"lora_paths: expected 'name=path', got {entry!r}")
        if name in parsed:
            raise ValueError(f"lora_paths: adapter name {name!r} given twice")
        parsed[name] = path
    return parsed
