"""The kubelet's gRPC APIs: the device plugin API v1beta1 and the pod resources API v1
(a subset), as ``.proto`` files and the Python code generated from them (``generate.py``)."""
