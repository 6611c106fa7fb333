"""Node labels compatible with gpu-feature-discovery, for NFD's local feature files."""

from .gfd import MIG_STRATEGIES, TIMESTAMP, Sharing, node_labels
from .output import FEATURES_FILE, parse, read_labels, render, write_labels

__all__ = ["node_labels", "Sharing", "MIG_STRATEGIES", "TIMESTAMP", "render", "parse", "read_labels",
           "write_labels", "FEATURES_FILE"]
