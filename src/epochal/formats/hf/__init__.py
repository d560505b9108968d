"""Hugging Face checkpoints: one module per model family, folder I/O and tokenizer export."""
