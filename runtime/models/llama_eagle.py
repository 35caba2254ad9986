"""An EAGLE draft head for a Llama-family target: one decoder layer on the target's features.

At sequence position p the head reads the pair (f_p, x_{p+1}): f_p is a feature (the target's
last hidden state at p, after its final norm: the vector its LM head reads; or, while drafting,
the head's own prediction of it) and x_{p+1} the token that follows. It computes

    g_{p+1} = norm(layer(fc(concat(f_p, embed(x_{p+1])))))     # the predicted feature at p + 1
    logits  = lm_head(g_{p+1})                                # the guess for x_{p+2}

with `layer` a `LlamaDecoderLayer` of the target's width (its attention over the head's own,
one-layer KV memory) and the target's embedding, LM head and RoPE table shared, not copied.

A head may draft from a "hot" vocabulary (config `draft_vocab_size`, tensor `hot_token_ids`:
the corpus's most frequent tokens, as EAGLE-3 does): its argmax then runs over those rows of
the LM head only, gathered once at `attach` (tiny: 8192 of 32000 rows, 94% of its held-out
tokens; a draft step reads a quarter of the LM head). The head always proposes a hot token.

The checkpoint is a folder of its own (as SGLang's EAGLE heads are): `config.json` with
`"architectures": ["LlamaForCausalLMEagle"]` and the target's shapes (`num_hidden_layers`
1), and safetensors holding `fc.weight`, `layers.0.*` (HF names: q/k/v, gate/up unfused) and
`norm.weight` (and `hot_token_ids`): no embedding, no LM head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from radixgen.runtime.distributed import TensorParallel
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.models.layers import RMSNorm
from radixgen.runtime.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from radixgen.runtime.models.parallel_layers import VocabParallelEmbedding

EAGLE_ARCHITECTURE = "LlamaForCausalLMEagle"


@dataclass(frozen=True)
class EagleHeadConfig:
    model: ModelConfig  # the decoder layer's shapes (the target's architecture)
    draft_vocab_size: int | None  # the hot vocabulary's size; None: the whole vocabulary


def read_eagle_config(head_path: str | Path, target_config: ModelConfig) -> EagleHeadConfig:
    """The head's config, checked against the target's.

    Raises:
        ValueError: naming `speculative_draft_model_path`: not an EAGLE head folder, or shapes
            that differ from the target's.
    """
    config_file = Path(head_path) / "config.json"
    if not config_file.is_file():
        raise ValueError(
            f"speculative_draft_model_path {str(head_path)!r} has no config.json (an EAGLE "
            "head is a folder with config.json and safetensors weights)"
        )
    raw = json.loads(config_file.read_text())
    if raw.get("architectures") != [EAGLE_ARCHITECTURE]:
        raise ValueError(
            f"speculative_draft_model_path {str(head_path)!r}: EAGLE needs a head whose "
            f"config.json says architectures [{EAGLE_ARCHITECTURE!r}], got "
            f"{raw.get('architectures')!r}"
        )
    config = ModelConfig.from_dict({**raw, "architectures": [target_config.architecture]})
    for field in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim"):
        if getattr(config, field) != getattr(target_config, field):
            raise ValueError(
                f"speculative_draft_model_path {str(head_path)!r}: the EAGLE head's {field} is "
                f"{getattr(config, field)}, the target's {getattr(target_config, field)}"
            )
    if config.num_layers != 1:
        raise ValueError(
            f"speculative_draft_model_path {str(head_path)!r}: an EAGLE head has one decoder "
            f"layer (num_hidden_layers 1), got {config.num_layers}"
        )
    draft_vocab_size = raw.get("draft_vocab_size")
    if draft_vocab_size is not None and not 0 < draft_vocab_size <= config.vocab_size:
        raise ValueError(
            f"speculative_draft_model_path {str(head_path)!r}: draft_vocab_size must be in "
            f"[1, {config.vocab_size}], got {draft_vocab_size}"
        )
    return EagleHeadConfig(config, draft_vocab_size)


class LlamaEagleHead(nn.Module):
    """Args:
    config: the head's shapes (`read_eagle_config`).

    `attach(target)` before use: the head borrows the target's embedding, LM head and RoPE
    table (kept outside the module's parameters, so loading and `state_dict` see only the
    head's own tensors).
    """

    def __init__(self, head_config: EagleHeadConfig):
        super().__init__()
        config = self.config = head_config.model
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0, None, TensorParallel())])
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        if head_config.draft_vocab_size is not None:
            hot = torch.empty(head_config.draft_vocab_size, dtype=torch.int64)
            self.register_buffer("hot_token_ids", hot)  # [draft_vocab_size], loaded
        else:
            self.hot_token_ids = None
        # (input embedding, LM head, RoPE), set by `attach`.
        self._target: tuple[VocabParallelEmbedding, VocabParallelEmbedding, nn.Module] | None = None
        self._hot_lm_head: torch.Tensor | None = None  # [draft_vocab_size, hidden]

    def attach(
        self,
        target: LlamaForCausalLM,
        whole_vocabulary: tuple[VocabParallelEmbedding, VocabParallelEmbedding] | None = None,
    ) -> None:
        """Borrows the target's RoPE table and its embedding and LM head, or
        `whole_vocabulary` (input embedding, LM head) instead where the target's are split over
        tensor-parallel ranks: the head runs on rank 0 alone."""
        embed_tokens, output_embedding = whole_vocabulary or (
            target.model.embed_tokens,
            target.output_embedding,
        )
        # A tuple: not registered as submodules (loading and state_dict see the head's own).
        self._target = (embed_tokens, output_embedding, target.model.rotary_emb)
        if self.hot_token_ids is not None:
            self._hot_lm_head = output_embedding.weight[self.hot_token_ids]

    def forward(
        self,
        forward_batch: ForwardBatch,
        features: torch.Tensor,  # [num_tokens, hidden]: f_p of each token x_{p+1}
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (the greedy draft [batch] int64, predicted features [batch, hidden]) at
        each request's last token."""
        embed_tokens, output_embedding, rotary_emb = self._target
        embedded = embed_tokens(forward_batch.input_ids)  # [num_tokens, hidden]
        hidden_states = self.fc(torch.cat([features.to(embedded.dtype), embedded], dim=-1))
        mlp_output, residual = self.layers[0](hidden_states, None, forward_batch, rotary_emb)
        if forward_batch.mode == ForwardMode.EXTEND:
            last = forward_batch.last_token_indices
            mlp_output, residual = mlp_output[last], residual[last]
        predicted = self.norm.add_and_norm(mlp_output, residual)[0]  # [batch, hidden]
        if self._hot_lm_head is None:
            return output_embedding.logits(predicted).argmax(dim=-1), predicted
        hot_logits = predicted @ self._hot_lm_head.T  # [batch, draft_vocab_size]
        return self.hot_token_ids[hot_logits.argmax(dim=-1)], predicted
