"""Run state: checkpoints, the run directory, RNG states, the model-state wrapper, preemption."""
