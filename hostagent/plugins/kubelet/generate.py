"""Regenerate the Python code of the kubelet APIs from the ``.proto`` files beside this one.

    python -m hostagent.plugins.kubelet.generate      # needs grpcio-tools (pip install '.[test]')

The generated ``*_pb2.py`` and ``*_pb2_grpc.py`` are checked in, so installing hostagent
needs only grpcio and protobuf; their versions must be at least the ones the generator
writes into them (``pyproject.toml`` says so). A test compiles the ``.proto`` files again
and checks that the checked-in code describes the same API.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]            # the directory holding the hostagent package
PROTOS = ("deviceplugin.proto", "podresources.proto", "pluginregistration.proto", "dra_v1.proto",
          "dra_v1beta1.proto", "drahealth_v1.proto", "drahealth_v1alpha1.proto")


def protoc_args(out: Path, names=PROTOS) -> list[str]:
    """Compiled from the package root, so the generated gRPC modules import their message
    modules as ``hostagent.plugins.kubelet.*_pb2``."""
    relative = HERE.relative_to(ROOT)
    return ["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={out}", f"--grpc_python_out={out}",
            *(str(relative / name) for name in names)]


def main() -> int:
    try:
        from grpc_tools import protoc
    except ImportError:
        print("generate: grpcio-tools is not installed (pip install grpcio-tools)", file=sys.stderr)
        return 1
    return protoc.main(protoc_args(ROOT))


if __name__ == "__main__":
    sys.exit(main())
