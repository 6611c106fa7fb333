"""Node labels compatible with gpu-feature-discovery, for NFD's local feature files."""

from .gfd import MIG_STRATEGIES, Sharing, node_labels
from .output import FEATURES_FILE, render, write_labels

__all__ = ["node_labels", "Sharing", "MIG_STRATEGIES", "render", "write_labels", "FEATURES_FILE"]
