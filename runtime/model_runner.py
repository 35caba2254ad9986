"""`ModelRunner`: the model, its KV memory and its attention backend, on one device.

Built once per worker from `ServerArgs`. It owns:
- `model`: the Llama-family decoder, loaded by `loader.load_model`;
- `req_to_token_pool`, `token_to_kv_pool`, `slot_allocator`: the token-level KV memory;
- `attn_backend`: "torch" (reference) or "triton" (kernels), chosen once.
It does not schedule, tokenize or sample: callers build a `ForwardBatch` (with
`build_forward_batch`) from requests whose rows and slots they allocated, and get logits back.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Sequence

import torch

from radixgen.kernels.tree_decode_plan import SharedSegment
from radixgen.radix_cache.memory_pool import (
    KVBudget,
    ReqToTokenPool,
    SlotAllocator,
    TokenToKVPool,
)
from radixgen.runtime.attention.base import AttentionBackend
from radixgen.runtime.distributed import TensorParallel
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode, build_forward_batch
from radixgen.runtime.kv_cache_scales import load_kv_cache_scales
from radixgen.runtime.loader import load_model
from radixgen.runtime.lora.manager import LoRAManager
from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.models.parallel_layers import VocabParallelEmbedding
from radixgen.runtime.server_args import ServerArgs
from radixgen.runtime.speculative.config import SpeculativeAlgorithm, resolve_speculative_config
from radixgen.runtime.tiny_model import resolve_model_path
from radixgen.runtime.tp_batch_sync import (
    announce_adapter_change,
    broadcast_forward_batch,
    receive_forward_batch,
    stop_followers,
)

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_KV_CACHE_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
# FP8 tensor cores and conversions: Ada (8.9) and Hopper (9.0) onwards.
_MIN_FP8_CAPABILITY = (8, 9)
# quantization_config methods whose weights are FP8 (need an FP8 GPU; int4 ones do not).
_FP8_METHODS = ("fp8", "compressed-tensors")
# CPU default KV size when max_total_tokens is unset: a few full contexts, within a bound
# of slots and of bytes (CPU runs are tests and demos; RAM is shared).
_CPU_DEFAULT_CONTEXTS = 4
_CPU_MAX_SLOTS = 1 << 16
_CPU_MAX_KV_BYTES = 512 << 20
# Derived max_running_requests: one row per this many KV slots, within [min, max]. Rows cost
# max_context_len int32 each, so the upper bound keeps req_to_token small on long contexts.
_SLOTS_PER_REQUEST = 64
_MIN_DERIVED_REQUESTS = 32
_MAX_DERIVED_REQUESTS = 1024
TRITON_BACKEND_MODULE = "radixgen.runtime.attention.triton_backend"


def resolve_device(device: str) -> torch.device:
    """ "auto" -> cuda if available else cpu; otherwise the named device.

    Raises:
        ValueError: an unparsable device, or cuda asked for without CUDA.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """ "auto" -> bfloat16 on CUDA, float32 on CPU; otherwise the named dtype."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {list(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """ "auto" -> the model dtype; "fp8"/"fp8_e4m3" -> e4m3; "fp8_e5m2" -> e5m2."""
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype not in _KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be 'auto' or one of {list(_KV_CACHE_DTYPES)}, "
            f"got {kv_cache_dtype!r}"
        )
    return _KV_CACHE_DTYPES[kv_cache_dtype]


def check_fp8_support(device: torch.device, option: str) -> None:
    """Refuses FP8 on CUDA GPUs older than compute capability 8.9 (the CPU emulates it).

    Raises:
        ValueError: naming `option` and the GPU's capability.
    """
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < _MIN_FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ValueError(
            f"{option} needs a GPU with FP8 support (compute capability >= 8.9: Ada, Hopper or "
            f"newer); {name} has {capability[0]}.{capability[1]}"
        )


class ModelRunner:
    """Loads the model and allocates the KV pools described by `server_args`.

    Attributes:
        model_path: the resolved local checkpoint folder ("tiny" built on first use).
        model_config, device, dtype, context_length: what was loaded, where, how long.
        model: the decoder (`model(forward_batch) -> logits`).
        req_to_token_pool, token_to_kv_pool, slot_allocator: KV memory.
        max_total_num_tokens: allocatable KV slots (excluding the padding slot 0).
        max_running_requests: rows of req_to_token.
        attn_backend_name, attn_backend: the attention implementation in use.
        tree_attention_enabled: decode batches may carry `shared_prefixes` (tree attention).
        parallel: this rank's tensor-parallel group; the model, the KV pools and the attention
            backend hold this rank's heads only (`num_local_heads`, `num_local_kv_heads`).
    """

    def __init__(self, server_args: ServerArgs, parallel: TensorParallel | None = None):
        self.server_args = server_args
        self.parallel = parallel or TensorParallel()
        self.model_path = resolve_model_path(server_args.model_path)
        self.device = resolve_device(server_args.device)
        if self.device.type == "cuda" and self.parallel.size > 1:
            self.device = torch.device("cuda", self.parallel.local_rank)  # one GPU per rank
        self.dtype = resolve_dtype(server_args.dtype, self.device)
        self.kv_cache_dtype = resolve_kv_cache_dtype(server_args.kv_cache_dtype, self.dtype)
        if self.kv_cache_dtype != self.dtype and self.kv_cache_dtype.itemsize == 1:
            check_fp8_support(self.device, f"kv_cache_dtype={server_args.kv_cache_dtype!r}")
        self.attn_backend_name = self._choose_attention_backend()  # before the slow load
        # Decode batches with shared cached prefixes read them once (tree attention): a Triton
        # backend path; the torch backend stays the plain reference.
        tree_attention = server_args.enable_tree_attention
        if tree_attention is None:
            tree_attention = self.device.type == "cuda"
        self.tree_attention_enabled = self.attn_backend_name == "triton" and tree_attention
        # EAGLE drafts from the target's last hidden states: its decode graphs keep them too.
        speculative = resolve_speculative_config(server_args)
        self.graphs_keep_hidden_states = (
            speculative is not None and speculative.algorithm is SpeculativeAlgorithm.EAGLE
        )
        self.model_config = ModelConfig.from_folder(self.model_path)
        self.context_length = server_args.context_length or self.model_config.context_length
        if self.context_length > self.model_config.context_length:
            logger.warning(
                "context_length %d exceeds the model's %d: positions beyond it were never trained",
                self.context_length,
                self.model_config.context_length,
            )
        if server_args.quantization == "fp8":
            check_fp8_support(self.device, "quantization='fp8'")
        elif (self.model_config.quantization_config or {}).get("quant_method") in _FP8_METHODS:
            check_fp8_support(self.device, "an FP8-quantized checkpoint")
        self.model = load_model(
            self.model_path,
            model_config=self.model_config,
            dtype=self.dtype,
            device=self.device,
            load_format=server_args.load_format,
            seed=server_args.seed,
            max_positions=max(self.context_length, self.model_config.context_length),
            quantization=server_args.quantization,
            parallel=self.parallel,
            fp8_fast_accum=not server_args.disable_fp8_fast_accum,
        )
        # EAGLE's head runs on rank 0 alone over the whole vocabulary: under tensor parallelism
        # every rank joins in gathering the split embedding and LM head once, rank 0 keeps them.
        self.whole_vocabulary = None
        if self.graphs_keep_hidden_states and self.parallel.size > 1:
            self.whole_vocabulary = self._gather_whole_vocabulary()
        attention = self.model.model.layers[0].self_attn if self.model_config.num_layers else None
        self.num_local_heads = attention.num_heads if attention else self.model_config.num_heads
        self.num_local_kv_heads = (
            attention.num_kv_heads if attention else self.model_config.num_kv_heads
        )
        self.lora_manager = self._create_lora_manager()
        self._init_memory_pools()
        self.attn_backend = self._create_attention_backend(self.attn_backend_name)
        self.cuda_graph_runner = self._create_cuda_graph_runner()
        logger.info(
            "loaded %s (%s) on %s in %s (linear layers: %s): %d KV slots of %s, %d request rows, "
            "%s attention%s",
            self.model_path,
            self.model_config.architecture,
            self.device,
            self.dtype,
            self.model.quant_config.method if self.model.quant_config else "unquantized",
            self.max_total_num_tokens,
            self.kv_cache_dtype,
            self.max_running_requests,
            self.attn_backend_name,
            " (tree decode attention)" if self.tree_attention_enabled else "",
        )

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.model_config.eos_token_ids

    def forward(
        self, forward_batch: ForwardBatch, return_hidden_states: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Runs the model on a batch (after the backend's per-batch metadata).

        Returns:
            float32 logits: [batch, vocab] (last token of each request), or
            [num_tokens, vocab] when `forward_batch.return_all_logits`; with
            `return_hidden_states` (EAGLE's verify forwards: from the CUDA graphs too when
            `graphs_keep_hidden_states`), (logits, every token's last hidden state
            [num_tokens, hidden_size]).
        """
        if self.parallel.size > 1 and self.parallel.is_leader:
            # The followers run it too.
            broadcast_forward_batch(self.parallel, forward_batch, self.lora_manager)
        # no_grad rather than inference_mode: callers may modify the logits in place.
        if self.lora_manager is not None:
            self.lora_manager.state.segments = forward_batch.lora_segments
        with torch.no_grad():
            graph_runner = self.cuda_graph_runner
            if (
                graph_runner is not None
                and (graph_runner.keeps_hidden_states or not return_hidden_states)
                and graph_runner.can_run(forward_batch)
            ):
                return graph_runner.replay(forward_batch, return_hidden_states)
            forward_batch.attn_backend.init_forward_metadata(forward_batch)
            return self.model(forward_batch, return_hidden_states)

    def follow(self) -> None:
        """A tensor-parallel follower (rank > 0): runs rank 0's batches until it stops them."""
        while (forward_batch := receive_forward_batch(self.parallel, self)) is not None:
            self.forward(forward_batch)  # the logits are rank 0's to use

    def stop_followers(self) -> None:
        """Rank 0: ends the followers' `follow()` (a no-op without tensor parallelism)."""
        if self.parallel.size > 1 and self.parallel.is_leader:
            stop_followers(self.parallel)

    def build_forward_batch(
        self,
        *,
        mode: ForwardMode,
        input_ids: Sequence[Sequence[int]] | torch.Tensor,
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
        return_all_logits: bool = False,
        shared_prefixes: tuple[SharedSegment, ...] | None = None,
        lora_slots: Sequence[int] | None = None,
    ) -> ForwardBatch:
        """`build_forward_batch` over this runner's pools and attention backend."""
        return build_forward_batch(
            mode=mode,
            input_ids=input_ids,
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            out_cache_loc=out_cache_loc,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            attn_backend=self.attn_backend,
            return_all_logits=return_all_logits,
            shared_prefixes=shared_prefixes,
            lora_slots=lora_slots,
        )

    def _gather_whole_vocabulary(
        self,
    ) -> tuple[VocabParallelEmbedding, VocabParallelEmbedding] | None:
        """(input embedding, LM head) over the whole vocabulary on rank 0 (None elsewhere);
        a collective: every rank calls it."""
        embed_tokens, output_embedding = self.model.model.embed_tokens, self.model.output_embedding
        gathered = [embed_tokens.gathered_weight()]
        if output_embedding is not embed_tokens:
            gathered.append(output_embedding.gathered_weight())
        if not self.parallel.is_leader:
            return None
        tables = [VocabParallelEmbedding.whole(weight) for weight in gathered]
        return tables[0], tables[-1]

    def _create_lora_manager(self) -> LoRAManager | None:
        """The adapters and their pool (before the KV pool: it sizes itself on what is left)."""
        args = self.server_args
        if not args.lora_enabled:
            return None
        manager = LoRAManager(
            self.model,
            lora_paths=args.lora_adapter_paths,
            max_loras_per_batch=args.max_loras_per_batch,
            max_lora_rank=args.max_lora_rank,
            target_modules=args.lora_target_modules,
            dtype=self.dtype,
            device=self.device,
            use_triton=self.device.type == "cuda",
        )
        if self.parallel.size > 1 and self.parallel.is_leader:
            manager.announce = functools.partial(announce_adapter_change, self.parallel)
        return manager

    def _init_memory_pools(self) -> None:
        config, args = self.model_config, self.server_args
        bytes_per_token = TokenToKVPool.bytes_per_token(
            config.num_layers, self.num_local_kv_heads, config.head_dim, self.kv_cache_dtype
        )
        if args.max_total_tokens is not None:
            budget = KVBudget(num_tokens=args.max_total_tokens)
        elif self.device.type == "cuda":
            # After the weights are loaded: the fraction applies to what they left free.
            budget = KVBudget(fraction_of_free_memory=args.mem_fraction_static)
        else:
            budget = KVBudget(
                num_tokens=max(
                    1,
                    min(
                        _CPU_DEFAULT_CONTEXTS * self.context_length,
                        _CPU_MAX_SLOTS,
                        _CPU_MAX_KV_BYTES // bytes_per_token,
                    ),
                )
            )
        num_slots = budget.resolve(bytes_per_token=bytes_per_token, device=self.device)
        self.max_total_num_tokens = num_slots - 1  # slot 0 is padding
        self.max_running_requests = args.max_running_requests or min(
            max(num_slots // _SLOTS_PER_REQUEST, _MIN_DERIVED_REQUESTS), _MAX_DERIVED_REQUESTS
        )
        self.req_to_token_pool = ReqToTokenPool(
            self.max_running_requests, self.context_length, device=self.device
        )
        self.token_to_kv_pool = TokenToKVPool(
            num_slots=num_slots,
            num_layers=config.num_layers,
            num_kv_heads=self.num_local_kv_heads,
            head_dim=config.head_dim,
            dtype=self.dtype,
            device=self.device,
            kv_dtype=self.kv_cache_dtype,
            kv_scales=self._fp8_kv_scales() if self.kv_cache_dtype.itemsize == 1 else None,
        )
        self.slot_allocator = SlotAllocator(num_slots, device=self.device)

    def _fp8_kv_scales(self) -> list[tuple[float, float]]:
        """Per-layer (k_scale, v_scale) of an FP8 pool: the --quantization-param-path file's
        (calibrated), else the checkpoint's (1.0 where it has none). A bf16 pool keeps K/V as
        they are and takes none."""
        path = self.server_args.quantization_param_path
        if path is None:
            return self.model.kv_cache_scales()
        return load_kv_cache_scales(
            path,
            num_layers=self.model_config.num_layers,
            kv_cache_dtype=self.server_args.kv_cache_dtype,
            tp_rank=self.parallel.rank,
        )

    def _choose_attention_backend(self) -> str:
        requested = self.server_args.attention_backend
        if requested == "triton" and self.device.type != "cuda" and not _triton_interpreter_on():
            # Without a GPU driver Triton fails only at the first launch, deep in a forward.
            raise ValueError(
                f"attention_backend='triton' needs a CUDA device (got {self.device.type!r}); on "
                "CPU it runs only under the Triton interpreter (TRITON_INTERPRET=1, slow): "
                "use attention_backend='torch'"
            )
        if requested is not None:
            return requested
        if self.device.type == "cuda" and importlib.util.find_spec(TRITON_BACKEND_MODULE):
            return "triton"
        return "torch"

    def _create_cuda_graph_runner(self):
        """Decode CUDA graphs: on CUDA with the Triton backend (it reads lengths on the device,
        so a captured graph serves any lengths), unless `disable_cuda_graph`."""
        if (
            self.device.type != "cuda"
            or self.server_args.disable_cuda_graph
            or self.attn_backend_name != "triton"
        ):
            return None
        from radixgen.runtime.cuda_graph_runner import CudaGraphRunner

        return CudaGraphRunner(self)

    def _create_attention_backend(self, name: str) -> AttentionBackend:
        # Imported here: the triton backend is optional and heavy to import.
        if name == "triton":
            from radixgen.runtime.attention.triton_backend import TritonAttentionBackend

            return TritonAttentionBackend(self)
        from radixgen.runtime.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(self)


def _triton_interpreter_on() -> bool:
    """Whether Triton kernels run on the CPU interpreter (read by Triton at import)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")
