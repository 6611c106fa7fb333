"""See hostagent's kubelet plugins work, with no cluster: the agent on a simulated DGX A100,
a plugin, and the test suite's kubelet (and, for DRA, its API server and scheduler), then what
a kubelet gets.

    .venv/bin/python tests/kubelet_demo.py device-plugin   # the sample pod's nvidia.com/gpu: 1
    .venv/bin/python tests/kubelet_demo.py dra             # NVIDIA's DRA demo claims

Run from a checkout, after the README's install (``pip install '.[try]'``: the test
scheduler evaluates CEL with cel-python); as root or as another user alike (as another user
the odd GPUs are not split into MIG devices for gpu-test4: NVML lets only root do that).
Everything runs in a temporary folder and is removed at the end.

- device-plugin: ``hostagent device-plugin`` registers ``nvidia.com/gpu`` with the kubelet;
  its ListAndWatch, then the kubelet's GetPreferredAllocation and Allocate for a pod asking
  for one GPU, as the plugin answers them.
- dra: ``hostagent dra-plugin`` registers with the kubelet and publishes its ResourceSlices
  in the API server; each of NVIDIA's quickstart claims (gpu-test1 ... gpu-test-mps) is made
  as its pods make it, allocated by the scheduler (the DeviceClasses of
  packaging/kubernetes/dra, CEL selectors, constraints), prepared by the plugin as the
  kubelet asks (NodePrepareResources: the CDI devices each container gets), then unprepared
  and deleted, so each demo finds the node as it was.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPU = "nvidia.com/gpu"
# NVIDIA's gpu-test4 takes four MIG devices of one GPU: the odd GPUs split so (as root only),
# the even ones stay whole for gpu-test6 (A100s of an even index).
MIG_LAYOUT = {"version": "v1", "mig-configs": {"demo": [
    {"devices": [1, 3, 5, 7], "mig-enabled": True, "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
    {"devices": [0, 2, 4, 6], "mig-enabled": False}]}}


def say(text: str = "") -> None:
    print(text, flush=True)


def device_plugin() -> int:
    import shutil
    import signal
    import tempfile
    from tests.integration.agentd import make_root, running_agent
    from tests.integration.kubelet import TestKubelet
    work = Path(tempfile.mkdtemp(prefix="hostagent-demo-"))
    kubelet = TestKubelet(work / "device-plugins")
    say("The agent on a simulated DGX A100 (8x A100-SXM4-40GB), the device plugin, a test kubelet:")
    with running_agent(make_root("dgx-a100"), {"daemon": {"resync_interval": 0}}) as agent:
        kubelet.start()
        plugin = subprocess.Popen(
            [sys.executable, "-m", "hostagent.cli.main", "--simulate", str(agent.root), "device-plugin",
             "--plugin-dir", str(kubelet.dir), "--pod-resources-socket", "none", "--log-level", "warning"],
            stdin=subprocess.DEVNULL)
        try:
            endpoint = kubelet.endpoint(GPU, timeout=30)
            devices = endpoint.wait(lambda found: len(found) == 8)
            say(f"\nRegister: {GPU} (device plugin API {kubelet.registrations[-1].version}), "
                f"endpoint {endpoint.request.endpoint}")
            say(f"ListAndWatch: {len(devices)} devices")
            for uuid, health, numa in devices:
                say(f"  {uuid}  {health}" + (f"  NUMA node {', '.join(map(str, numa))}" if numa else ""))
            say(f"\nThe sample pod (resources: limits: {GPU}: 1):")
            available = [d[0] for d in devices]
            preferred = kubelet.prefer(GPU, available, 1)
            say(f"GetPreferredAllocation: {preferred}")
            answer = kubelet.allocate(GPU, preferred).container_responses[0]
            say("Allocate: the container gets")
            for cdi in answer.cdi_devices:
                say(f"  CDI device   {cdi.name}")
            for key, value in sorted(answer.envs.items()):
                say(f"  env          {key}={value}")
            for spec in answer.devices:
                say(f"  device node  {spec.container_path} (host {spec.host_path}, {spec.permissions})")
            for mount in answer.mounts:
                say(f"  mount        {mount.container_path} <- {mount.host_path}")
            for key, value in sorted(answer.annotations.items()):
                say(f"  annotation   {key}={value}")
            with agent.client() as client:
                [alloc] = client.allocations()
            say(f"\nThe agent's allocation: {alloc['id']} -> devices {alloc['devices']}")
        finally:
            plugin.send_signal(signal.SIGTERM)
            plugin.wait(15)
            kubelet.stop()
            shutil.rmtree(work, ignore_errors=True)
    return 0


def dra() -> int:
    from tests.integration.dracluster import NODE, Cluster, quickstart
    from tests.integration.drasched import Unschedulable
    cluster = Cluster(plugin_args=("--passthrough",))
    say("The agent on a simulated DGX A100 (8x A100-SXM4-40GB), the DRA plugin, the test API server "
        "(Kubernetes 1.34), a test kubelet and a test scheduler:")
    try:
        cluster.start()
        plugin = cluster.kubelet.plugin()
        if os.geteuid() == 0:
            with cluster.agent.client(timeout=None) as c:
                c.mig_apply("demo", spec=MIG_LAYOUT)
        say(f"\nRegistration: driver {plugin.info.name}, DRA service {plugin.dra_version}, health "
            f"{plugin.health_version}, endpoint {plugin.info.endpoint}")
        from tests.waiting import until
        if os.geteuid() == 0:
            until(lambda: any("-mig-" in name for name in cluster.devices()), timeout=30,
                  what="the MIG devices published")
        devices = cluster.devices()
        say(f"ResourceSlices of pool {NODE}: {len(devices)} devices")
        for name, device in devices.items():
            attrs = {k: next(iter(v.values())) for k, v in (device.get("attributes") or {}).items()}
            memory = (device.get("capacity") or {}).get("memory", {}).get("value", "")
            say(f"  {name:<32} {attrs.get('type', ''):<4} {attrs.get('productName', '')} "
                f"{attrs.get('profile', '')} {memory}".rstrip())
        if os.geteuid() != 0:
            say("  (as root, the odd GPUs are split into MIG devices for gpu-test4)")
        for demo in quickstart().values():
            say(f"\n{demo['demo']}:")
            claims = cluster.claims(demo)
            allocated = []
            for claim in claims:
                name = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
                try:
                    allocated.append(cluster.scheduler.allocate(claim, NODE))
                except Unschedulable as e:
                    say(f"  claim {name}: not allocated ({e})")
            for claim in allocated:
                name = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
                [(prepared, error)] = cluster.kubelet.prepare(claim).values()
                if error:
                    say(f"  claim {name}: NodePrepareResources error: {error}")
                    continue
                say(f"  claim {name}:")
                for requests, pool, device, cdi in prepared:
                    say(f"    {', '.join(requests):<14} {device:<32} {' '.join(cdi)}")
            cluster.forget(allocated)
            for claim in claims:
                if claim not in allocated:
                    cluster.api.delete_claim(claim["metadata"]["namespace"], claim["metadata"]["name"])
    finally:
        cluster.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See docs/device-plugin.md and docs/dra.md.")
    parser.add_argument("plugin", choices=("device-plugin", "dra"))
    args = parser.parse_args()
    try:
        return device_plugin() if args.plugin == "device-plugin" else dra()
    except ImportError as e:
        print(f"kubelet_demo.py: error: {e.name} is not installed (install hostagent with: .venv/bin/pip install "
              "'.[try]')", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
