"""Optimization: the optimizer and its parameter groups, the LR/WD schedule, fp16 loss scaling."""
