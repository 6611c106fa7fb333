"""The DRA kubelet plugin: the agent's devices as ResourceSlices of a DRA driver
(``gpu.nvidia.com`` by default, so NVIDIA's DeviceClasses and claims select them), and the
kubelet's NodePrepareResources and NodeUnprepareResources answered with agent allocations.
An API consumer of the agent like the device plugin: never NVML.

- ``registrar``: the plugin registration service the kubelet's plugin watcher finds;
- ``service``: the DRAPlugin (v1, v1beta1) and DRAResourceHealth (v1, v1alpha1) services;
- ``health``: the devices' health as the kubelet's health stream says it.

Nothing here imports a Kubernetes client at module level: ``hostagent dra-plugin`` imports it
when it runs, so neither the agent nor the CLI's start-up pays for it.
"""
