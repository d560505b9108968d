"""A tiny Llama-shaped tokenizer with a chat template, built offline, and chat rows for it.

The tokenizer is a byte-level BPE trained on a few lines (``tokenizers``) wrapped in
``transformers.PreTrainedTokenizerFast``: it adds ``<s>`` in front of plain text (as
Llama's does), ends text with ``</s>``, and its chat template marks the assistant turns
with ``{% generation %}`` (end-of-turn token included), as TRL's training templates do.
"""

from __future__ import annotations

import functools

LINES = [
    "What is the capital of France?",
    "The capital of France is Paris.",
    "Tell me a joke about cats.",
    "Why did the cat sit on the computer? To keep an eye on the mouse.",
    "You are a helpful assistant.",
    "Count to five: one two three four five.",
    "hello world, how are you today?",
]
SPECIAL = ["<s>", "</s>", "<pad>", "<|start|>", "<|sep|>", "<|eot|>"]
#: Llama 3's chat tokens, for its own template
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "<|start|>assistant<|sep|>{% generation %}{{ message['content'] }}<|eot|>{% endgeneration %}"
    "{% else %}<|start|>{{ message['role'] }}<|sep|>{{ message['content'] }}<|eot|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant<|sep|>{% endif %}"
)
#: the same template without generation markers
PLAIN_TEMPLATE = TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")

MESSAGES_ROWS = [
    {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Count to five."},
            {"role": "assistant", "content": "one two three four five"},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the cat sit on the computer?"},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hello world"},
        ]
    },
]

PROMPT_COMPLETION_ROWS = [
    {"prompt": "What is the capital", "completion": " of France? Paris."},
    {"prompt": "Tell me a joke about", "completion": " cats."},
    {"prompt": "Count to five:", "completion": " one two three four five"},
    # merges across the boundary: "hel" + "lo world" tokenizes differently joined
    {"prompt": "hel", "completion": "lo world"},
]

CONVERSATIONAL_PC_ROWS = [
    {
        "prompt": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "completion": [{"role": "assistant", "content": "The capital of France is Paris."}],
    },
    {
        "prompt": [{"role": "user", "content": "Tell me a joke."}],
        "completion": [{"role": "assistant", "content": "To keep an eye on the mouse."}],
    },
]


@functools.cache
def _backend():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL + LLAMA3_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(LINES, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tok.to_str()


def tiny_chat_tokenizer(template: str | None = TEMPLATE, *, llama3: bool = False):
    """A fresh ``PreTrainedTokenizerFast`` (callers may mutate it, e.g. TRL sets pad).

    ``llama3=True``: Llama 3's BOS and end-of-turn tokens (for its chat template).
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_backend()),
        bos_token="<|begin_of_text|>" if llama3 else "<s>",
        eos_token="<|eot_id|>" if llama3 else "</s>",
        pad_token="<pad>",
        chat_template=template,
    )


def tiny_llama(vocab_size: int, seed: int = 0):
    """A 2-layer ``transformers`` Llama (hidden 64, GQA), float32, eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()
