"""``hostagent device-plugin``: the kubelet device plugin, an API consumer of the agent."""

from __future__ import annotations

from .common import host_from_args, seconds

__all__ = ["register"]

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


def _list_strategy(text: str) -> tuple[str, ...]:
    import argparse
    from ..plugins.allocations import LIST_STRATEGIES
    items = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in items if s not in LIST_STRATEGIES]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{', '.join(bad) or 'nothing'}: choose from {', '.join(LIST_STRATEGIES)}")
    return items


def register(sub) -> None:
    p = sub.add_parser(
        "device-plugin", help="serve the agent's GPUs and MIG devices to the kubelet",
        description="The kubelet device plugin (API v1beta1): GPUs and MIG devices as nvidia.com/gpu and "
                    "nvidia.com/mig-<profile> resources, health from the agent, allocations made in the "
                    "agent. Runs until SIGTERM. See docs/device-plugin.md.")
    p.add_argument("--plugin-dir", metavar="DIR",
                   help=f"the kubelet's device plugin directory (default {PLUGIN_DIR}; under the simulated "
                        "root with --simulate)")
    p.add_argument("--agent-socket", metavar="PATH",
                   help="the agent's API socket (default /run/hostagent/hostagent.sock; under the simulated root)")
    p.add_argument("--mig-strategy", choices=("none", "single", "mixed"),
                   help="how MIG devices become resources (default: the strategy of the agent's node "
                        "labels, so resources and labels agree: its labels.mig_strategy, else the sharing "
                        "configuration's flags.migStrategy, else none)")
    p.add_argument("--device-list-strategy", type=_list_strategy, default=("cdi-cri", "envvar"),
                   metavar="LIST",
                   help="what Allocate answers, comma-separated: cdi-cri (CDI device names), envvar "
                        "(NVIDIA_VISIBLE_DEVICES, for the legacy NVIDIA hook), edits (device nodes, mounts "
                        "and env, for runtimes with neither); default cdi-cri,envvar")
    p.add_argument("--cdi-names", choices=("node", "allocation"), default="node",
                   help="CDI names from the node's spec (default: they outlive the allocation) or the "
                        "allocation's transient spec")
    p.add_argument("--shared-allocation-policy", choices=("distributed", "packed"), default="distributed",
                   help="replicas of shared devices: spread across devices (default) or fill one first")
    p.add_argument("--pod-resources-socket", metavar="PATH",
                   help=f"the kubelet's pod resources API, to release allocations no container holds "
                        f"(default {POD_RESOURCES}; 'none' to not use it)")
    p.add_argument("--allocation-expiry", type=seconds, default=86400.0, metavar="SECONDS",
                   help="without the pod resources API, release an allocation not allocated again for "
                        "this long (default 86400; 0: never)")
    p.add_argument("--reconcile-interval", type=seconds, default=60.0, metavar="SECONDS",
                   help="how often allocations are checked against the kubelet (default 60)")
    p.add_argument("--release-grace", type=seconds, default=60.0, metavar="SECONDS",
                   help="never release an allocation made or allocated again in the last SECONDS: the "
                        "kubelet records a container's devices only after Allocate (default 60)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.set_defaults(run=run)


def options_from_args(args):
    from pathlib import Path
    from ..client import DEFAULT_SOCKET
    from ..plugins.deviceplugin import Options
    host = host_from_args(args, node=False)      # paths only: the agent there is what it follows
    pod_resources = args.pod_resources_socket or host.host(POD_RESOURCES)
    return Options(
        plugin_dir=Path(args.plugin_dir or host.host(PLUGIN_DIR)),
        agent_socket=Path(args.agent_socket or host.host(DEFAULT_SOCKET)),
        mig_strategy=args.mig_strategy, device_list_strategy=args.device_list_strategy,
        cdi_names=args.cdi_names, shared_policy=args.shared_allocation_policy,
        pod_resources_socket=None if str(pod_resources) == "none" else Path(pod_resources),
        allocation_expiry=args.allocation_expiry,
        reconcile_interval=max(args.reconcile_interval, 0.1), release_grace=args.release_grace)


def run(args) -> int:
    import signal
    from ..daemon.logs import setup_logging
    from ..daemon.notify import Notifier
    from ..plugins.deviceplugin import DevicePlugin
    setup_logging(args.log_level, identifier="hostagent-device-plugin")
    plugin = DevicePlugin(options_from_args(args), Notifier())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: plugin.stop())
    return plugin.run()
