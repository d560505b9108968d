"""Megatron samplers, the micro-batch calculator, resumable loaders and the Lightning data module."""
