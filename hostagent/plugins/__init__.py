"""Kubelet-side plugins: API consumers of the agent, never NVML.

``agentlink`` is the part any kubelet plugin shares (the agent's devices as its watch stream
keeps them, and the allocation calls); ``deviceplugin`` serves the kubelet's device plugin
API v1beta1 on top of it; ``kubelet`` holds the kubelet's gRPC APIs.
"""
