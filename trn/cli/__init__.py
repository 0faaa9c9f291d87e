"""Console entry points: ``trn-data`` and ``trn-sim``."""
