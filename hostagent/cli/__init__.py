"""The command-line interface: parses arguments and calls the functions the daemon calls."""
