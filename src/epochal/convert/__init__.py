"""epochal.convert."""
