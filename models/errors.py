"""Errors raised by the model layer."""


class ModelError(Exception):
    """Base class for model-layer errors."""


class FitError(ModelError, ValueError):
    """The probes cannot determine the model (too few distinct levels, repeated levels only)."""
