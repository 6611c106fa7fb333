"""CDI specs for the node's GPUs and MIG devices: generate, validate, write, list."""
