"""The kubelet's gRPC APIs, as ``.proto`` files and the Python code generated from them
(``generate.py``): the device plugin API v1beta1, the pod resources API v1 (a subset), the
plugin registration API, the DRA plugin API v1 and v1beta1, and the DRA resource health
API v1 and v1alpha1."""
