"""epochal.model."""
