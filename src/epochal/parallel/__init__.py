"""epochal.parallel."""
