"""An EAGLE draft head for a Llama-family target: one decoder layer on the target's features.

At sequence position p the head reads the pair (f_p, x_{p+1}): f_p is a feature (the target's
last hidden state at p, after its final norm: the vector its LM head reads; or, while drafting,
the head's own prediction of it) and x_{p+1} the token that follows. It computes

    g_{p+1} = norm(layer(fc(concat(f_p, embed(x_{p+1])))))     # the predicted feature at p + 1
    logits  = lm_head(g_{p+1})                                # the guess for x_{p+2}

with `layer` a `LlamaDecoderLayer` of the target's width (its attention over the head's own,
one-layer KV memory) and the target's embedding, LM head and RoPE table shared, not copied.

The checkpoint is a folder of its own (as SGLang's EAGLE heads are): `config.json` with
`"architectures": ["LlamaForCausalLMEagle"]` and the target's shapes (`num_hidden_layers`
1), and safetensors holding `fc.weight`, `layers.0.*` (HF names: q/k/v, gate/up unfused) and
`norm.weight`: no embedding, no LM head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from radixgen.runtime.distributed import TensorParallel
from radixgen.runtime.forward_batch import ForwardBatch, ForwardMode
from radixgen.runtime.model_config import ModelConfig
from radixgen.runtime.models.layers import RMSNorm
from radixgen.runtime.models.llama import LlamaDecoderLayer, LlamaForCausalLM

EAGLE_ARCHITECTURE = "LlamaForCausalLMEagle"


def read_eagle_config(head_path: str | Path, target_config: ModelConfig) -> ModelConfig:
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
    return config


class LlamaEagleHead(nn.Module):
    """Args:
    config: the head's shapes (`read_eagle_config`).

    `attach(target)` before use: the head borrows the target's embedding, LM head and RoPE
    table (kept outside the module's parameters, so loading and `state_dict` see only the
    head's own tensors).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0, None, TensorParallel())])
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self._target: tuple[LlamaForCausalLM, ...] = ()

    def attach(self, target: LlamaForCausalLM) -> None:
        self._target = (target,)  # a tuple: not registered as a submodule

    def forward(
        self,
        forward_batch: ForwardBatch,
        features: torch.Tensor,  # [num_tokens, hidden]: f_p of each token x_{p+1}
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (float32 logits [batch, vocab], predicted features [batch, hidden]) at each
        request's last token."""
        (target,) = self._target
        embedded = target.model.embed_tokens(forward_batch.input_ids)  # [num_tokens, hidden]
        hidden_states = self.fc(torch.cat([features.to(embedded.dtype), embedded], dim=-1))
        mlp_output, residual = self.layers[0](
            hidden_states, None, forward_batch, target.model.rotary_emb
        )
        if forward_batch.mode == ForwardMode.EXTEND:
            last = forward_batch.last_token_indices
            mlp_output, residual = mlp_output[last], residual[last]
        predicted = self.norm.add_and_norm(mlp_output, residual)[0]  # [batch, hidden]
        return target.output_embedding.logits(predicted).float(), predicted
