"""trl-warmup: pre-warm compile caches for TRL training jobs."""

__version__ = "0.1.0"
