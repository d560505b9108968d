"""Decoding (greedy, top-k, top-p, beam search) and KV caches."""
