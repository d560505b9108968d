"""epochal.train."""
