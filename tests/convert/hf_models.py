"""Tiny random Hugging Face models and our models for the conversion/generation tests (no downloads)."""

from __future__ import annotations

import dataclasses

import torch

from epochal.model import GPTModel, ModelConfig


def as_read_from_hf(config: ModelConfig) -> ModelConfig:
    """``config`` as a Hugging Face folder gives it back: the loss leaves the padded ids out."""
    return dataclasses.replace(config, padded_vocab_in_softmax=False)


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int, std: float = 0.2) -> torch.nn.Module:
    """Overwrite every parameter with seeded noise (norm weights around 1) so logits are not tiny."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=gen) * std
        lower = name.lower()
        if "norm" in lower or ".ln_" in name or ".ln." in name or name.startswith("ln."):
            base = 1.0 if name.endswith("weight") else 0.0
            p.copy_(base + 0.1 * noise / std)
        else:
            p.copy_(noise)
    return module


def hf_gpt2(*, tied: bool = True, seed: int = 0, vocab: int = 100, **kw):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=vocab,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=tied,
        **kw,
    )
    with torch.random.fork_rng():  # transformers initializes with the global RNG; we overwrite it
        model = GPT2LMHeadModel(cfg)
    return randomize(model, seed).eval()


# RoPE scaling for the tiny Llama (head_dim 8, rope_theta 500: wavelengths 6, 30, 140 and
# 660 tokens). With original_max_position_embeddings=32 the llama3 thresholds are 8 and 32
# tokens, so one frequency is kept, one interpolated and two divided by the factor.
HF_ROPE_SCALING = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "linear": {"rope_type": "linear", "factor": 3.0},
}


def hf_llama(
    *,
    tied: bool = False,
    groups: int = 2,
    bias: bool = False,
    seed: int = 0,
    vocab: int = 100,
    **kw,
):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=groups,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        attention_bias=bias,
        mlp_bias=bias,
        rope_theta=500.0,
        bos_token_id=0,
        eos_token_id=1,
        **kw,
    )
    with torch.random.fork_rng():
        model = LlamaForCausalLM(cfg)
    return randomize(model, seed).eval()


#: family -> (transformers config class, model class) of the Llama-shaped decoders people fine-tune.
DECODER_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def hf_decoder(family: str, *, seed: int = 0, vocab: int = 100, **kw):
    """A tiny random Qwen2 / Qwen3 / Mistral / Llama (2 layers, hidden 64, 4 heads, 2 KV groups)."""
    import transformers

    config_name, model_name = DECODER_FAMILIES[family]
    options = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500.0,
        bos_token_id=0,
        eos_token_id=1,
    )
    cfg = getattr(transformers, config_name)(**{**options, **kw})
    with torch.random.fork_rng():
        model = getattr(transformers, model_name)(cfg)
    return randomize(model, seed).eval()


def ours(config: ModelConfig, seed: int = 0) -> GPTModel:
    """Our model with randomized weights (same recipe as the HF ones)."""
    return randomize(GPTModel(config, seed=seed), seed).eval()


def gpt2_like(**kw) -> ModelConfig:
    base = dict(
        vocab_size=100,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        activation="gelu_tanh",
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    base.update(kw)
    return ModelConfig(**base)


def llama_like(**kw) -> ModelConfig:
    base = dict(
        vocab_size=100,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=48,
        max_position_embeddings=64,
        position_embedding_type="rope",
        rotary_base=500.0,
        normalization="RMSNorm",
        norm_epsilon=1e-6,
        activation="swiglu",
        add_bias_linear=False,
        untie_embeddings_and_output_weights=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    base.update(kw)
    return ModelConfig(**base)


# ------------------------------------------------------------------ encoders
def hf_bert(cls_name: str = "BertForMaskedLM", *, seed: int = 0, vocab: int = 100, **kw):
    """A tiny random ``Bert*`` / ``MegatronBert*`` model (``cls_name`` from transformers)."""
    import transformers

    config_cls = (
        transformers.MegatronBertConfig
        if cls_name.startswith("MegatronBert")
        else transformers.BertConfig
    )
    cfg = config_cls(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        type_vocab_size=2,
        **kw,
    )
    with torch.random.fork_rng():
        model = getattr(transformers, cls_name)(cfg)
    return randomize(model, seed).eval()


def hf_esm(*, seed: int = 0, token_dropout: bool = True, **kw):
    """A tiny random ESM-2 ``EsmForMaskedLM`` (33-token alphabet, mask 32, pad 1)."""
    from transformers import EsmConfig, EsmForMaskedLM

    options = dict(
        vocab_size=33,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=66,
        position_embedding_type="rotary",
        token_dropout=token_dropout,
        mask_token_id=32,
        pad_token_id=1,
        emb_layer_norm_before=False,
    )
    cfg = EsmConfig(**{**options, **kw})
    with torch.random.fork_rng():
        model = EsmForMaskedLM(cfg)
    return randomize(model, seed).eval()


def encoder_like(type: str = "bert", **kw) -> ModelConfig:
    """A tiny BERT (``type="bert"``) or ESM-2 (``type="esm"``) config of ours."""
    base = dict(
        type=type,
        vocab_size=100,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        ffn_hidden_size=48,
        max_position_embeddings=64,
        norm_epsilon=1e-12,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    if type == "bert":
        base.update(num_tokentypes=2)
    else:
        base.update(
            vocab_size=33,
            position_embedding_type="rope",
            token_dropout=True,
            mask_token_id=32,
            pad_token_id=1,
        )
    base.update(kw)
    return ModelConfig(**base)


def hf_t5(version: str = "1.1", *, seed: int = 0, vocab: int = 96, std: float = 0.1, **kw):
    """A tiny random Hugging Face T5 in eval mode: ``"1.0"`` (relu, scaled tied head),
    ``"1.1"`` (gated-gelu, unscaled head) or ``"mt5"`` (MT5 class, gated-gelu)."""
    import transformers

    v10 = version == "1.0"
    values = dict(
        vocab_size=vocab,
        d_model=64,
        d_kv=16,
        d_ff=96,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        dropout_rate=0.0,
        feed_forward_proj="relu" if v10 else "gated-gelu",
        tie_word_embeddings=v10,
        layer_norm_epsilon=1e-6,
        decoder_start_token_id=0,
    )
    values.update(kw)
    if version == "mt5":
        model = transformers.MT5ForConditionalGeneration(transformers.MT5Config(**values))
    else:
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(**values))
    randomize(model, seed, std=std)
    return model.eval()


def t5_inputs(vocab: int = 96, seed: int = 1):
    """``(encoder ids [3, 11], decoder ids [3, 7], encoder mask, decoder mask)`` with padding."""
    g = torch.Generator().manual_seed(seed)
    enc = torch.randint(2, vocab, (3, 11), generator=g)
    dec = torch.randint(2, vocab, (3, 7), generator=g)
    enc_mask = torch.ones(3, 11, dtype=torch.long)
    enc_mask[1, 8:] = 0
    enc_mask[2, 4:] = 0
    dec_mask = torch.ones(3, 7, dtype=torch.long)
    dec_mask[2, 5:] = 0
    return enc, dec, enc_mask, dec_mask
