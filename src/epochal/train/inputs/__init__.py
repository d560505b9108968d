"""The data each model type trains on: loaders and datasets per model type, the
standard-library demo corpus, and the per-epoch evidence printed in the run summary."""
