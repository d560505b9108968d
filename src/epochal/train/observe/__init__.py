"""Observation: metrics (JSONL, TensorBoard), loss plots, Weights & Biases."""
