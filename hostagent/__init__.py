"""hostagent: one dependable host service for GPU nodes."""

__version__ = "0.1.0"
