"""GPT samples, blends, splits, index caches and mock corpora built on indexed files."""
