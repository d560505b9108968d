"""How much memory one micro-batch's activations take: estimated before anything is allocated.

The count follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (Megatron-LM): a pre-norm GPT layer at 16 bits, with dropout and
attention that materialises its scores, holds ``s*b*h*(34 + 5*a*s/h)`` bytes for the
backward (``s`` tokens per sequence, ``b`` sequences, hidden ``h``, ``a`` heads). The
terms of that sum, generalised to what this trainer's layers keep (``T = b*s`` tokens,
``e`` bytes per compute element, ``r`` per residual-stream element):

==============================  ==========================================================
the norms' inputs               ``2*T*h*r`` (RMSNorm also keeps its normalised input,
                                ``T*h*r`` per norm)
the linears' inputs             ``T*h*e`` for q/k/v and for the MLP's first linear (under
                                bf16/fp16 autocast one cast copy per linear: q, k and v
                                three, a gated MLP two), ``T*heads*head_dim*e`` for the
                                attention output projection
q, k, v                         ``T*head_dim*(heads + 2*kv_heads)*e`` (GQA: the key/value
                                groups, or all heads where they are repeated)
core attention                  its output ``T*heads*head_dim*e``; a fused kernel (flash,
                                memory-efficient, cuDNN, the CPU's flash) adds its
                                log-sum-exp ``4*b*heads*s``; the math path (chosen with
                                ``training.attention_backend=math``, and on the CPU for
                                attention dropout) keeps copies of q, k, v (all heads) and
                                the softmax ``b*heads*s*s*e``, and with dropout its mask
                                and output: Megatron's ``5*a*s/h`` (on the CPU these are
                                float32: PyTorch upcasts 16-bit inputs there)
dropout                         a mask per residual branch, ``T*h`` bytes (CUDA's bool) or
                                ``T*h*e`` (the CPU's mask in the input's dtype)
MLP                             GELU/ReLU: ``2*T*ffn*e`` (the first linear's output and the
                                activation's); SwiGLU / gated GELU: ``4*T*ffn*e`` (gate,
                                up, the activation and the product)
==============================  ==========================================================

With ``e = 2``, ``r = 2``, a 16-bit CUDA mask, ``ffn = 4h`` and LayerNorm this is
exactly Megatron's ``34 + 5as/h``. Here bf16/fp16 runs autocast over float32 weights:
the residual stream stays float32 (``r = 4``), and each linear's weight is cast to a
16-bit copy kept for the backward (2 bytes per linear weight). Outside the layers: the
final norm's input, the output layer's input, and the logits: the plain cross-entropy
keeps a float32 log-softmax, ``4*T*vocab`` (``training.loss_chunk_tokens`` or
``compile_loss`` keep the ``e``-byte logits instead); a BERT's masked-LM head transform
adds ``3*T*h*e``. T5's decoder layers add a cross-attention over the encoder's tokens.
A mixture-of-experts layer runs its experts' MLP term on ``topk`` copies of the tokens
and keeps its router's float32 scores.

Recompute (``parallel.recompute_granularity``):

- ``selective`` keeps the outputs of the matmuls and of the attention kernel and each
  layer's input (:mod:`epochal.parallel.recompute`): ``T*(heads*head_dim +
  2*kv_heads*head_dim + 2h)*e`` for the attention and output projections,
  ``T*ffn*e`` per MLP input linear, the attention kernel's output (the math path: also
  its ``b*heads*s*s*e`` scores), ``T*h*r`` for the input. Megatron's own selective
  recompute drops only the ``5as/h`` term.
- ``full`` keeps only the input of each recomputed group of layers, ``T*h*r``
  (Megatron's ``2sbh`` per layer); the backward then recomputes one group at a time,
  whose activations are added as the backward's transient peak.

Layouts divide what each process holds: tensor parallelism divides everything computed
per head or per MLP column by ``tensor_parallel`` (key/value groups fewer than it are
replicated), sequence parallelism also the norms, dropout masks and residual stream,
while the linears' gathered inputs stay whole (PyTorch's DTensor plans keep the
all-gathered input for the backward); context parallelism divides the tokens (and the
scores' query side) by ``context_parallel``; the logits are divided over the
vocabulary under tensor parallelism. Pipeline parallelism: the first stage holds its
layers for every micro-batch in flight, ``min(micro-batches, stages)`` under 1F1B (so
about the whole model's layers of one micro-batch, as Megatron states), every
micro-batch under GPipe, and ``min(m*v, 2(p-1) + (v-1)p + 1)`` model chunks under the
interleaved schedule; the last stage holds the logits of one. Data parallelism divides
no activation.

The backward's transient peak on top of the stored activations is the larger of the
logits' gradient (``(4 + e)*T*vocab``) and, under full recompute, one recomputed group.
What is not counted: the allocator's fragmentation and the workspace of kernels, and
``torch.compile``'s own choices of what to keep (usually less). The test suite measures
the stored part against the bytes that are alive after the forward of tiny models
(``tests/train/test_activation_memory.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from epochal.model.config import ModelConfig

__all__ = ["ActivationEstimate", "activation_bytes", "in_flight"]


@dataclass(frozen=True)
class ActivationEstimate:
    """One process's activation memory for one training step, in bytes.

    Attributes:
        layers: what the transformer layers keep for the backward (all micro-batches
            in flight on this process).
        outside: embeddings, the final norm, the output layer, the logits and, under
            bf16/fp16 autocast, the 16-bit copies of the linear weights.
        transient: the most the backward adds on top (the logits' gradient, or one
            recomputed group of layers).
        micro_batch: sequences per micro-batch; ``seq_length``: tokens per sequence.
        in_flight: micro-batches whose layers are held at once (pipeline schedule).
    """

    layers: int
    outside: int
    transient: int
    micro_batch: int
    seq_length: int
    in_flight: int

    @property
    def stored(self) -> int:
        """What is held at the end of the forward: ``layers + outside``."""
        return self.layers + self.outside

    @property
    def total(self) -> int:
        """The peak: ``stored + transient``."""
        return self.stored + self.transient


@dataclass(frozen=True)
class _Sizes:
    """Element sizes and layout divisions of one run (see the module docstring)."""

    e: int  # bytes per compute element (2 under bf16/fp16 autocast)
    r: int  # bytes per residual-stream element (float32 weights: 4)
    mask: int  # bytes per hidden-dropout mask element
    autocast: bool
    tp: int
    sp: bool
    fused: bool  # the attention kernel keeps no scores
    math: int  # bytes per element of the math attention path (float32 on the CPU)
    native_gqa: bool  # grouped keys/values reach the kernel without repeated copies
    layer_weights: float  # elements of one block's linear weights


def _sizes(config: Any, model: ModelConfig, device_type: str, layer_weights: float) -> _Sizes:
    t, p = config.training, config.parallel
    autocast = bool(t.bf16 or t.fp16)
    e = 2 if autocast else 4
    cpu = device_type == "cpu"
    dropout = model.attention_dropout > 0
    fused = t.attention_backend != "math" and not (cpu and dropout)
    plain_causal = model.type == "gpt" and model.position_embedding_type != "alibi"
    return _Sizes(
        e=e,
        r=4,
        mask=e if cpu else 1,
        autocast=autocast,
        tp=p.tensor_parallel,
        sp=p.sequence_parallel and p.tensor_parallel > 1,
        fused=fused,
        math=4 if cpu else e,
        native_gqa=cpu and plain_causal and not model.sliding_window,
        layer_weights=layer_weights,
    )


def _heads(model: ModelConfig, z: _Sizes) -> tuple[float, float, float]:
    """``(query heads, kv heads kept, kv heads projected)`` per tensor-parallel rank."""
    a, g = model.num_attention_heads, model.num_kv_heads
    local_g = g / z.tp if g >= z.tp else g
    kept = local_g if z.native_gqa or g == a else a / z.tp
    return a / z.tp, kept, local_g


def _attention(
    model: ModelConfig, z: _Sizes, b: int, s_q: float, s_k: float, selective: bool, *, cross: bool
) -> float:
    """One attention sub-block's kept bytes (norm input to output projection input)."""
    d, h = model.head_dim, model.hidden_size
    heads, kv_kept, kv_proj = _heads(model, z)
    tq, tk = b * s_q, b * s_k
    bias = 0.0
    if model.position_embedding_type in ("relative", "alibi") and not cross:
        bias = heads * s_q * s_k * z.e * (b if model.position_embedding_type == "alibi" else 1)
    out = tq * heads * d * z.e  # the kernel's output: the output projection's input
    if z.fused:
        kernel = out + 4 * b * heads * s_q
        qkv = tq * heads * d * z.e + 2 * tk * kv_kept * d * z.e
    else:  # the math path: copies of q, k, v (all heads) and the softmax, in ``z.math``
        m = z.math
        scores = b * heads * s_q * s_k
        dropout = scores * (m + (m if z.mask > 1 else 1)) if model.attention_dropout > 0 else 0
        kernel = out + scores * m + dropout
        grouped = tk * heads * d * m if kv_proj < heads else 0.0  # the scaled keys
        qkv = tq * heads * d * m + 2 * tk * heads * d * m + grouped
    if selective:  # the matmuls' outputs and the kernel's (the layer input: the caller)
        projections = tq * heads * d * z.e + 2 * tk * kv_proj * d * z.e + tq * h * z.e
        if z.fused:
            return projections + out + 4 * b * heads * s_q + bias
        return projections + tq * heads * d * z.math + b * heads * s_q * s_k * z.math + bias
    residual = tq * h * z.r / (z.tp if z.sp else 1)
    norm = residual * (2 if model.normalization == "RMSNorm" else 1)
    linear_in = tq * h * z.e * (3 if z.autocast else 1)
    if cross:  # keys and values come from the encoder's output
        linear_in = tq * h * z.e + (2 * tk * h * z.e if z.autocast else 0)
    dropout = tq * h * z.mask / (z.tp if z.sp else 1) if model.hidden_dropout > 0 else 0.0
    return norm + linear_in + qkv + kernel + dropout + bias


def _mlp(model: ModelConfig, z: _Sizes, tokens: float, selective: bool) -> float:
    """One MLP sub-block's kept bytes (dense, or a mixture of experts)."""
    h = model.hidden_size
    gated = model.activation in ("swiglu", "gated_gelu")

    def dense(t: float, f: float) -> float:
        f = f / z.tp
        if selective:
            return t * f * z.e * (2 if gated else 1) + t * h * z.e
        inputs = t * h * z.e * (2 if gated and z.autocast else 1)
        return inputs + t * f * z.e * (4 if gated else 2)

    residual = tokens * h * z.r / (z.tp if z.sp else 1)
    norm = 0.0 if selective else residual * (2 if model.normalization == "RMSNorm" else 1)
    dropout = 0.0
    if not selective and model.hidden_dropout > 0:
        dropout = tokens * h * z.mask / (z.tp if z.sp else 1)
    if not model.num_experts:
        return norm + dense(tokens, model.ffn_size) + dropout
    topk = model.moe_router_topk
    routed = dense(tokens * topk, model.moe_ffn_size) + 2 * tokens * topk * h * z.e
    shared = model.moe_shared_expert_intermediate_size
    router = tokens * model.num_experts * 4 * 2
    return norm + routed + (dense(tokens, shared) if shared else 0.0) + router + dropout


def _layer(
    model: ModelConfig, z: _Sizes, b: int, s: float, selective: bool, *, context: float = 0
) -> float:
    """A whole block: self-attention (+ cross-attention over ``context`` tokens) + MLP."""
    kept = _attention(model, z, b, s, s, selective, cross=False)
    if context:
        kept += _attention(model, z, b, s, context, selective, cross=True)
    kept += _mlp(model, z, b * s, selective)
    if selective:
        kept += b * s * model.hidden_size * z.r / (z.tp if z.sp else 1)
    elif z.autocast:  # the 16-bit copies of the layer's weights (recomputed when recomputing)
        kept += 2 * z.layer_weights / z.tp
    return kept


def in_flight(schedule: str, stages: int, micro_batches: int, chunks: int) -> float:
    """Micro-batches whose first-stage layers are held at once, in units of the stage's layers.

    Returns:
        ``min(m, p)`` for 1F1B, ``m`` for GPipe, and for the interleaved schedule
        ``min(m*v, 2(p-1) + (v-1)p + 1)`` chunk passes of ``1/v`` of the stage each.
    """
    if stages <= 1:
        return 1.0
    if schedule == "gpipe":
        return float(micro_batches)
    if schedule == "interleaved_1f1b" and chunks > 1:
        passes = min(micro_batches * chunks, 2 * (stages - 1) + (chunks - 1) * stages + 1)
        return passes / chunks
    return float(min(micro_batches, stages))


def _stage_layers(p: Any, layers: int) -> int:
    """The first pipeline stage's transformer layers."""
    if p.pipeline_parallel <= 1:
        return layers
    if p.decoder_first_pipeline_num_layers is not None:
        return p.decoder_first_pipeline_num_layers
    rest = layers - (p.decoder_last_pipeline_num_layers or 0)
    stages = p.pipeline_parallel - (1 if p.decoder_last_pipeline_num_layers is not None else 0)
    return math.ceil(rest / max(1, stages))


def _stack(
    model: ModelConfig, z: _Sizes, p: Any, layers: int, b: int, s: float, context: float = 0
) -> tuple[float, float]:
    """``(kept, recompute transient)`` of ``layers`` blocks under ``parallel.recompute_*``."""
    granularity = p.recompute_granularity
    full_layer = _layer(model, z, b, s, False, context=context)
    if granularity == "selective":
        return layers * _layer(model, z, b, s, True, context=context), 0.0
    if granularity != "full" or layers == 0:
        return layers * full_layer, 0.0
    n = max(1, p.recompute_num_layers)
    group_input = b * s * model.hidden_size * z.r / (z.tp if z.sp else 1)
    if p.recompute_method == "block":
        wrapped = min(n, layers)
        return wrapped * group_input + (layers - wrapped) * full_layer, full_layer
    groups = math.ceil(layers / n)
    return groups * group_input, min(n, layers) * full_layer


def _output_weights(model: ModelConfig) -> int:
    """Elements of the output layer's weight (none with a fine-tuning head's few outputs)."""
    return model.padded_vocab_size * model.hidden_size if model.head == "mlm" else 0


def _outside(model: ModelConfig, z: _Sizes, config: Any, tokens: float) -> tuple[float, float]:
    """``(kept, transient)`` outside the blocks: embeddings, final norm, output layer, logits."""
    h, t = model.hidden_size, config.training
    vocab = model.padded_vocab_size / z.tp
    kept = tokens * h * z.r  # the final norm's input
    if model.normalization == "RMSNorm":
        kept += tokens * h * z.r
    if model.hidden_dropout > 0:
        kept += tokens * h * (z.r if z.mask > 1 else 1)  # the embeddings' dropout mask
    if model.head == "mlm":
        kept += tokens * h * z.e  # the output layer's input
        if model.is_encoder:
            kept += 3 * tokens * h * z.e  # the masked-LM head transform
        chunked = t.loss_chunk_tokens > 0 or (t.compile and t.compile_loss)
        kept += tokens * vocab * (z.e if chunked and z.tp == 1 else 4)
    if z.autocast:
        kept += 2 * _output_weights(model) / z.tp
    transient = tokens * vocab * (4 + z.e) if model.head == "mlm" else 0.0
    return kept, transient


def _micro_batches(config: Any) -> int:
    t, p = config.training, config.parallel
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = p.data_parallel or max(1, world // (p.model_parallel_size or 1))
    return max(1, t.global_batch_size // max(1, t.micro_batch_size * dp))


def activation_bytes(
    config: Any, model: ModelConfig, device_type: str, linear_weights: int = 0
) -> ActivationEstimate:
    """Estimate one process's activation memory (see the module docstring).

    Args:
        config: the ``TrainConfig`` (``training.micro_batch_size``, precision, attention
            backend and loss options; ``data.seq_length`` and for T5
            ``data.seq_length_decoder``; ``parallel.*``).
        model: the resolved model.
        device_type: ``"cpu"`` or ``"cuda"`` (which attention kernels and dropout masks).
        linear_weights: elements of the model's linear weights (their 16-bit copies under
            autocast); 0 leaves them out.

    Returns:
        The estimate, in bytes.
    """
    p = config.parallel
    in_blocks = max(0, linear_weights - _output_weights(model)) / max(1, model.num_blocks)
    z = _sizes(config, model, device_type, in_blocks)
    b = config.training.micro_batch_size
    cp = max(1, p.context_parallel)
    s = config.data.seq_length / cp
    if model.type == "t5":
        s_dec = config.data.seq_length_decoder / cp
        enc, enc_t = _stack(model, z, p, model.num_encoder_layers, b, s)
        dec, dec_t = _stack(model, z, p, model.num_decoder_layers, b, s_dec, context=s)
        layers, recompute, flight, tokens = enc + dec, max(enc_t, dec_t), 1.0, b * s_dec
        layers += b * s * model.hidden_size * z.e  # the encoder's output, read by the decoder
    else:
        stage = _stage_layers(p, model.num_layers)
        flight = in_flight(p.pipeline_schedule, p.pipeline_parallel, _micro_batches(config),
                           p.virtual_pipeline)  # fmt: skip
        per_pass, recompute = _stack(model, z, p, stage, b, s)
        layers, tokens = per_pass * flight, b * s
    outside, logits = _outside(model, z, config, tokens)
    if model.type != "t5" and p.pipeline_parallel > 1:
        # the first stage holds its layers for every micro-batch in flight, the last
        # stage one micro-batch of its layers and the logits: the larger of the two
        last, last_recompute = _stack(
            model, z, p, p.decoder_last_pipeline_num_layers or stage, b, s
        )
        if layers + recompute > last + outside + max(last_recompute, logits):
            outside, logits = 0.0, 0.0
        else:
            layers, recompute, flight = last, last_recompute, 1.0
    return ActivationEstimate(
        layers=int(layers),
        outside=int(outside),
        transient=int(max(recompute, logits)),
        micro_batch=b,
        seq_length=config.data.seq_length,
        in_flight=math.ceil(flight),
    )
