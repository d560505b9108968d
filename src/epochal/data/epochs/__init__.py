"""EpochIndex, the O(1)-memory permutation, multi-epoch resamplers and per-epoch masking."""
