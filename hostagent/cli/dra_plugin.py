"""``hostagent dra-plugin``: the DRA kubelet plugin, an API consumer of the agent."""

from __future__ import annotations

from .common import cluster_arguments, host_from_args, node_name, positive_seconds

__all__ = ["register"]

REGISTRY = "/var/lib/kubelet/plugins_registry"
PLUGINS = "/var/lib/kubelet/plugins"
DRIVER = "gpu.nvidia.com"


def _driver(text: str) -> str:
    import argparse
    import re
    if len(text) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a DRA driver name (a lower-case DNS subdomain of at "
                                         "most 63 characters, like gpu.nvidia.com)")
    return text


def register(sub) -> None:
    p = sub.add_parser(
        "dra-plugin", help="serve the agent's GPUs and MIG devices to Kubernetes' dynamic resource allocation",
        description="The DRA kubelet plugin (resource.k8s.io/v1): the agent's GPUs, MIG devices and, with "
                    "--dynamic-mig, MIG partitions made on demand as the ResourceSlices of a DRA driver, and "
                    "resource claims prepared as agent allocations. Runs until SIGTERM. See docs/dra.md.")
    cluster_arguments(p)
    p.add_argument("--plugin-registry", metavar="DIR",
                   help=f"the kubelet's plugin registry folder (default {REGISTRY}; under the simulated root "
                        "with --simulate)")
    p.add_argument("--plugin-dir", metavar="DIR",
                   help=f"where the DRA service's socket goes (default {PLUGINS}/<driver name>)")
    p.add_argument("--driver-name", type=_driver, default=DRIVER, metavar="NAME",
                   help=f"the DRA driver's name (default {DRIVER}, which NVIDIA's DeviceClasses select)")
    p.add_argument("--agent-socket", metavar="PATH",
                   help="the agent's API socket (default /run/hostagent/hostagent.sock; under the simulated root)")
    p.add_argument("--dynamic-mig", action="store_true",
                   help="offer every MIG profile at every free placement of the GPUs in MIG mode, made when a "
                        "claim is prepared (needs the DRAPartitionableDevices feature gate)")
    p.add_argument("--passthrough", action="store_true",
                   help="also offer each GPU as NVIDIA's vfio device (class vfio.gpu.nvidia.com): a claim on it "
                        "passes the GPU through to a VM, bound to vfio-pci while it is prepared (needs the IOMMU "
                        "on; the GPU and its vfio device share a counter, with DRAPartitionableDevices)")
    p.add_argument("--taint-no-execute", action="store_true",
                   help="taint devices that cannot recover (XID 79, a lost GPU) NoExecute instead of NoSchedule, "
                        "so Kubernetes evicts the pods using them (needs the DRADeviceTaints feature gate, on "
                        "from 1.36); other unhealthy devices are tainted NoSchedule either way")
    p.add_argument("--resync", type=positive_seconds, default=60.0, metavar="SECONDS",
                   help="how often the published slices are compared with the API server's (default 60)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.set_defaults(run=run)


def options_from_args(args, environ=None):
    import os
    from pathlib import Path
    from ..client import DEFAULT_SOCKET
    from ..plugins.dra.plugin import Options
    environ = os.environ if environ is None else environ
    node = node_name(args, environ)
    host = host_from_args(args)
    return Options(
        node=node, driver=args.driver_name,
        registry_dir=Path(args.plugin_registry or host.host(REGISTRY)),
        plugin_dir=Path(args.plugin_dir or host.host(f"{PLUGINS}/{args.driver_name}")),
        agent_socket=Path(args.agent_socket or host.host(DEFAULT_SOCKET)),
        dynamic_mig=args.dynamic_mig, passthrough=args.passthrough, no_execute=args.taint_no_execute,
        resync=args.resync)


# What the unit's ProtectSystem=strict and its ReadWritePaths= (folders that exist when it starts) allow.
SANDBOX_HINT = ("hostagent-dra-plugin.service may write only in /var/lib/kubelet/plugins_registry and "
                "/var/lib/kubelet/plugins, and only if they exist when it starts (ProtectSystem=strict with "
                "ReadWritePaths=): the kubelet makes them; on a node without them yet, mkdir -p both, then "
                "systemctl restart hostagent-dra-plugin; in a container, mount them read-write")


def run(args) -> int:
    import errno
    import signal
    from ..errors import StateError
    from .errors import os_error
    from ..daemon.logs import setup_logging
    from ..daemon.notify import Notifier
    options = options_from_args(args)
    from ..plugins.dra.kube import KubeApi, load_config       # the Kubernetes client: only here
    from ..plugins.dra.plugin import DraPlugin
    api = KubeApi(load_config(args.kubeconfig))
    setup_logging(args.log_level, identifier="hostagent-dra-plugin")
    import logging
    for noisy in ("httpx2", "httpcore2", "httpx", "httpcore"):   # a line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    plugin = DraPlugin(options, api, Notifier())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: plugin.stop())
    # The modules and objects of start-up live as long as the process: out of the collector's
    # sight, a full collection during a prepare walks only what the requests made.
    import gc
    gc.collect()
    gc.freeze()
    try:
        return plugin.run()
    except OSError as e:
        if e.errno == errno.EROFS:          # its sockets' folders, read-only in the unit's sandbox
            raise StateError(f"cannot serve the kubelet: {os_error(e)}", hint=SANDBOX_HINT) from None
        raise
    finally:
        api.close()
