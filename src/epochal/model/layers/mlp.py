"""The feed-forward block: GELU / ReLU MLP, SwiGLU or gated GELU.

Parameters (stable names):

- GELU / ReLU (``activation="gelu"``, ``"gelu_tanh"`` or ``"relu"``): ``fc1``
  (hidden -> ffn), ``fc2`` (ffn -> hidden); ``out = fc2(act(fc1(x)))``.
- SwiGLU / gated GELU (``activation="swiglu"`` or ``"gated_gelu"``): ``w1``
  (gate, hidden -> ffn), ``w3`` (up, hidden -> ffn), ``w2`` (down, ffn -> hidden);
  ``out = w2(act(w1(x)) * w3(x))`` with ``act`` = SiLU, or GELU's tanh
  approximation (Hugging Face T5 v1.1's ``wi_0`` / ``wi_1`` / ``wo``).
  Megatron fuses ``[w1; w3]`` into one ``linear_fc1`` (gate rows first); Hugging
  Face Llama calls them ``gate_proj``, ``up_proj``, ``down_proj``.

All linears have biases iff ``add_bias_linear``. Tensor parallelism shards
``fc1``/``w1``/``w3`` by columns and ``fc2``/``w2`` by rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from epochal.model.config import ModelConfig

__all__ = ["ACTIVATION_FUNCTIONS", "GATED_ACTIVATIONS", "MLP"]

#: activations with a gate (``w1``, ``w3``, ``w2``).
GATED_ACTIVATIONS = ("swiglu", "gated_gelu")
#: each ``activation``'s elementwise function (gated: of the gate ``w1(x)``, times ``w3(x)``)
ACTIVATION_FUNCTIONS = {
    "swiglu": F.silu,
    "gated_gelu": lambda t: F.gelu(t, approximate="tanh"),
    "relu": F.relu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "gelu": F.gelu,
}


class MLP(nn.Module):
    """Position-wise feed-forward network over ``[..., hidden]``.

    Args:
        config: the model config (activation, widths, biases).
        ffn_size: the inner width; ``None`` = ``config.ffn_size`` (an MoE expert passes its own).
    """

    def __init__(self, config: ModelConfig, ffn_size: int | None = None) -> None:
        super().__init__()
        h, bias = config.hidden_size, config.add_bias_linear
        f = config.ffn_size if ffn_size is None else ffn_size
        self.activation = config.activation
        if self.activation in GATED_ACTIVATIONS:
            self.w1 = nn.Linear(h, f, bias=bias)
            self.w3 = nn.Linear(h, f, bias=bias)
            self.w2 = nn.Linear(f, h, bias=bias)
        else:
            self.fc1 = nn.Linear(h, f, bias=bias)
            self.fc2 = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., hidden] -> [..., hidden]``."""
        act = ACTIVATION_FUNCTIONS[self.activation]
        if self.activation in GATED_ACTIVATIONS:
            return self.w2(act(self.w1(x)) * self.w3(x))
        return self.fc2(act(self.fc1(x)))
