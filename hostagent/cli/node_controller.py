"""``hostagent node-controller``: the cluster drives the node (MIG layouts and GPU sharing
chosen by node labels, their state reported back; the fleet's driver version, installed one
slot at a time) and sees its GPU faults (Node Events, a condition, a taint). An API consumer
of the agent and of the Kubernetes API."""

from __future__ import annotations

from .common import cluster_arguments, host_from_args, node_name, positive_seconds

__all__ = ["register", "options_from_args"]

POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


def register(sub) -> None:
    p = sub.add_parser(
        "node-controller", help="apply MIG layouts and GPU sharing named by node labels; report GPU faults on the Node",
        description="One per node: applies the MIG config named by the node label nvidia.com/mig.config and the "
                    "sharing config named by nvidia.com/device-plugin.config through the agent, reports their "
                    "state in nvidia.com/mig.config.state and nvidia.com/device-plugin.config.state, upgrades "
                    "the driver to the version of the ConfigMap hostagent-driver when a Lease slot admits the "
                    "node (nvidia.com/gpu-driver-upgrade-state), and turns the agent's GPU health into Events, "
                    "the GPUUnhealthy condition and, optionally, a taint on the Node. Runs until SIGTERM. See "
                    "docs/node-controller.md.")
    cluster_arguments(p)
    p.add_argument("--namespace", metavar="NS", default="hostagent",
                   help="the agent's namespace in the cluster: the Events, the ConfigMap hostagent-driver and "
                        "the driver upgrades' Leases (default hostagent)")
    p.add_argument("--mig-config", metavar="FILE",
                   help="the mig-parted file whose named configs the label chooses (default: the agent's own, "
                        "generated from the GPUs: all-disabled, all-enabled, all-1g.5gb, all-balanced, ...)")
    p.add_argument("--sharing-configs", metavar="DIR",
                   help="a folder of named sharing configs, one file each in the device plugin's format (a "
                        "ConfigMap mounted as a folder); without it, sharing is left alone")
    p.add_argument("--default-sharing-config", metavar="NAME",
                   help="the sharing config without the label (default: the one named 'default', else the only "
                        "one, else none)")
    p.add_argument("--on-busy", choices=("wait", "fail", "evict"), default="wait",
                   help="when a change would take devices from allocations: wait until they are released (the "
                        "default), fail, or cordon the node and evict the pods holding them")
    p.add_argument("--eviction-timeout", type=positive_seconds, default=300.0, metavar="SECONDS",
                   help="with --on-busy evict: how long evictions a disruption budget refuses are retried, and "
                        "the devices waited for, from when the evictions began, a restart included (default 300)")
    p.add_argument("--taint-unhealthy", action="store_true",
                   help="taint the node nvidia.com/gpu.unhealthy=true:NoSchedule while every GPU is unhealthy")
    p.add_argument("--agent-socket", metavar="PATH",
                   help="the agent's API socket (default /run/hostagent/hostagent.sock; under the simulated root)")
    p.add_argument("--pod-resources-socket", metavar="PATH",
                   help=f"the kubelet's pod resources socket, to find the pods holding the device plugin's "
                        f"devices with --on-busy evict (default {POD_RESOURCES}; under the simulated root)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what the controller would do now, change nothing, and exit")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.set_defaults(run=run)


def options_from_args(args, environ=None):
    import os
    from pathlib import Path
    from ..client import DEFAULT_SOCKET
    from ..errors import NotFoundError, UsageError
    from ..plugins.nodecontroller.context import Options
    environ = os.environ if environ is None else environ
    node = node_name(args, environ)
    if args.sharing_configs is not None and not Path(args.sharing_configs).is_dir():
        raise NotFoundError("the sharing configs folder does not exist", where=args.sharing_configs,
                            hint="give --sharing-configs a folder of named configs (a ConfigMap mounted as one)")
    if args.default_sharing_config is not None and args.sharing_configs is None:
        raise UsageError("--default-sharing-config needs --sharing-configs DIR")
    host = host_from_args(args)
    return Options(
        node=node, namespace=args.namespace, agent_socket=Path(args.agent_socket or host.host(DEFAULT_SOCKET)),
        mig_config=Path(args.mig_config) if args.mig_config else None,
        sharing_configs=Path(args.sharing_configs) if args.sharing_configs else None,
        default_sharing_config=args.default_sharing_config, on_busy=args.on_busy,
        taint_unhealthy=args.taint_unhealthy, eviction_timeout=args.eviction_timeout,
        pod_resources=Path(args.pod_resources_socket or host.host(POD_RESOURCES)))


def run(args) -> int:
    import signal
    from ..daemon.logs import setup_logging
    from ..daemon.notify import Notifier
    options = options_from_args(args)
    from ..plugins.nodecontroller.configs import read_mig_file
    mig_file = read_mig_file(options.mig_config)
    if mig_file.problem and args.dry_run:
        from ..errors import ConfigError
        raise ConfigError(mig_file.problem)
    from ..plugins.nodecontroller.kube import NodeApi, load_config       # the Kubernetes client: only here
    api = NodeApi(load_config(args.kubeconfig))
    try:
        if args.dry_run:
            from ..plugins.nodecontroller.dryrun import dry_run
            for line in dry_run(options, api, mig_file):
                print(line)
            return 0
        from ..plugins.nodecontroller.controller import NodeController
        setup_logging(args.log_level, identifier="hostagent-node-controller")
        import logging
        for noisy in ("httpx2", "httpcore2", "httpx", "httpcore"):   # a line per request otherwise
            logging.getLogger(noisy).setLevel(logging.WARNING)
        controller = NodeController(options, api, Notifier())
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: controller.stop())
        return controller.run()
    finally:
        api.close()
