"""align: alignment pipelines declared in YAML, scheduled with Ray, trained with TRL."""

__version__ = "0.1.0"
