"""Shared transformer layers: attention, MLP, norms, positions, the transformer block."""
