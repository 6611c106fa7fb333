"""The agent daemon: start-up reconcile, node state, allocations, events; serves the API."""
