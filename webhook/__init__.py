"""runguard: admission webhook policy engine for ML platform runs."""

__version__ = "0.1.0"
