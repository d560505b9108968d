"""Megatron's .bin/.idx format: readers, builder, tokenizers, preprocess/merge/inspect commands."""
