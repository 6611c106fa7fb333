"""packaging/kubernetes: every manifest is valid against the Kubernetes OpenAPI schemas
(strict: an unknown or misplaced field fails), and the DaemonSet asks for what the agent
needs and no more. The base's files are checked as written; the overlays (dra, simulated,
simulated/dra, monitoring) as kustomize renders them for 'kubectl apply -k'
(tests/kubernetes_overlays.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hostagent import __version__
from hostagent.config import validate_data

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the [test] extra")

MANIFESTS = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "base"
# The oldest Kubernetes release still in wide use, and the newest the schemas know.
VERSIONS = ("1.27.0", str(kv.latest_version()))
# The image's own hostagentd, asking the agent for GET /v1/node on its socket.
PROBE = ("hostagentd", "--check")
PLUGIN = ("hostagent", "device-plugin")
# The agent: the host's / read-only at /host, and read-write over it what it writes.
AGENT_PATHS = {"/", "/run/hostagent", "/var/lib/hostagent", "/etc/hostagent", "/etc/cdi", "/run/cdi", "/dev",
               "/etc/kubernetes/node-feature-discovery/features.d", "/run/nvidia/validations"}
# The device plugin: the agent's socket (read-only: connecting needs no write), the
# kubelet's device plugin folder, its pod resources socket.
PLUGIN_PATHS = {"/run/hostagent": True, "/var/lib/kubelet/device-plugins": False,
                "/var/lib/kubelet/pod-resources": True}


def documents() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def kind(name: str) -> dict:
    return next(doc for _, doc in documents() if doc["kind"] == name)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name, doc", documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_is_valid_for_kubernetes(name, doc, version):
    kv.validate(doc, version, strict=True)


def test_a_manifest_that_breaks_the_schema_is_caught():
    broken = kind("DaemonSet")
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"] = "hostagentd --check"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, VERSIONS[-1], strict=True)
    broken = kind("DaemonSet")
    broken["spec"]["template"]["spec"]["tolerations"][0]["efect"] = "NoSchedule"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest_and_tags_the_image_with_the_version():
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    # Eviction's permissions are applied by those who use it (--on-busy evict).
    assert sorted(kustomization["resources"]) == sorted({name for name, _ in documents()} - {OPT_IN})
    for container in kind("DaemonSet")["spec"]["template"]["spec"]["containers"]:
        assert container["image"] == f"localhost/hostagent:{__version__}"
    assert kustomization["images"] == [{"name": "localhost/hostagent", "newTag": __version__}]


def test_daemonset_runs_on_gpu_nodes_first_and_asks_only_for_what_the_agent_uses():
    spec = kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {t["matchExpressions"][0]["key"] for t in terms} == {"feature.node.kubernetes.io/pci-10de.present",
                                                                "nvidia.com/gpu.present"}
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    agent, plugin = spec["containers"][0], container("device-plugin")

    def mounts(container):
        return {host_paths[m["name"]]: m.get("readOnly", False) for m in container["volumeMounts"]
                if m["name"] in host_paths}
    assert set(mounts(agent)) == AGENT_PATHS and mounts(plugin) == PLUGIN_PATHS
    assert set(host_paths.values()) == AGENT_PATHS | set(PLUGIN_PATHS)
    assert {m["name"] for c in spec["containers"] for m in c["volumeMounts"]} == {v["name"] for v in spec["volumes"]}
    # Under /host, each at its host path (resolved: /var/run is a link to /run on hosts).
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["HOSTAGENT_HOST_ROOT"] == "/host"
    for m in agent["volumeMounts"]:
        if m["name"] in host_paths and m["mountPath"] != "/dev":
            assert m["mountPath"] == "/host" + host_paths[m["name"]].rstrip("/"), m
            assert not host_paths[m["name"]].startswith("/var/run/")
            assert m.get("readOnly", False) == (m["mountPath"] == "/host")
    propagated = [m for c in (agent, plugin) for m in c["volumeMounts"] if "mountPropagation" in m]
    assert [(m["mountPath"], m["mountPropagation"]) for m in propagated] == [("/host", "HostToContainer")]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert tuple(agent[probe]["exec"]["command"]) == PROBE
    # The plugin is an API client: no privilege, no capability, one image for both.
    assert tuple(plugin["command"]) == PLUGIN and plugin["image"] == agent["image"]
    assert plugin["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                         "capabilities": {"drop": ["ALL"]}}
    assert kind("DaemonSet")["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    # The stop grace covers the unit's TimeoutStopSec (a MIG rollback on stop).
    assert spec["terminationGracePeriodSeconds"] >= 120


def container(name: str) -> dict:
    return next(c for c in kind("DaemonSet")["spec"]["template"]["spec"]["containers"] if c["name"] == name)


OPT_IN = "node-controller-force-rbac.yaml"
# The node controller's least privilege, feature by feature (docs/node-controller.md):
# (kind, API group, resource, resource names) -> verbs.
CONTROLLER_RULES = {
    "node-controller-rbac.yaml": {("ClusterRole", "", "nodes", ()): ["get", "watch", "patch"],
                                  ("ClusterRole", "", "nodes/status", ()): ["patch"],
                                  ("ClusterRole", "", "pods", ()): ["list"],
                                  ("ClusterRole", "", "pods/eviction", ()): ["create"],
                                  ("ClusterRole", "resource.k8s.io", "resourceclaims", ()): ["get"],
                                  ("Role", "", "events", ()): ["create", "patch"],
                                  ("Role", "", "configmaps", ("hostagent-driver",)): ["get", "watch"],
                                  ("Role", "coordination.k8s.io", "leases", ()): ["list", "watch", "create", "update"]},
    OPT_IN: {("ClusterRole", "", "pods", ()): ["delete"]}}


def test_only_the_node_controller_may_use_the_kubernetes_api_and_only_for_what_it_does():
    rules: dict = {}
    for name, doc in documents():
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                (group,) = rule["apiGroups"]
                for resource in rule["resources"]:
                    key = (doc["kind"], group, resource, tuple(rule.get("resourceNames", ())))
                    rules.setdefault(name, {})[key] = rule["verbs"]
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert name in CONTROLLER_RULES
            assert doc["subjects"] == [{"kind": "ServiceAccount", "name": "hostagent", "namespace": "hostagent"}]
    assert rules == CONTROLLER_RULES
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert "node-controller-rbac.yaml" in kustomization["resources"] and OPT_IN not in kustomization["resources"]
    assert kind("ServiceAccount")["automountServiceAccountToken"] is False
    spec = kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "hostagent" and spec["automountServiceAccountToken"] is False
    token = [c["name"] for c in spec["containers"] for m in c["volumeMounts"] if m["name"] == "node-controller-token"]
    assert token == ["node-controller"]


def test_the_node_controller_reads_the_configmaps_its_flags_name_and_the_agents_socket():
    c = container("node-controller")
    assert tuple(c["command"][:2]) == ("hostagent", "node-controller") and c["image"] == container("hostagent")["image"]
    # Root (the agent's admin on its socket: it applies MIG layouts and sharing) without a capability.
    assert c["securityContext"] == {"runAsUser": 0, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    volumes = {v["name"]: v for v in kind("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    flags = dict(zip(c["command"][2::2], c["command"][3::2]))
    maps = {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == "ConfigMap"}
    mig = mounts[str(Path(flags["--mig-config"]).parent)]["configMap"]["name"]
    from hostagent.mig.spec import parse_spec
    assert {"all-disabled", "all-1g.5gb"} <= set(parse_spec(maps[mig]["data"]["config.yaml"]).configs)
    sharing = maps[mounts[flags["--sharing-configs"]]["configMap"]["name"]]["data"]
    from hostagent.sharing.config import load_text
    assert {"default", "slice-4"} <= set(sharing) and all(load_text(text, k) for k, text in sharing.items())
    assert mounts["/run/hostagent"]["hostPath"]["path"] == "/run/hostagent"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace"}


@pytest.mark.parametrize("version", [f"1.{minor}.0" for minor in range(30, 36)])
def test_the_node_controllers_manifests_are_valid_for_kubernetes_1_30_to_1_35(version):
    for name, doc in documents():
        if name.startswith("node-controller") or doc["kind"] == "DaemonSet":
            kv.validate(doc, version, strict=True)


def test_configmap_is_a_valid_hostagent_configuration():
    config = yaml.safe_load(kind("ConfigMap")["data"]["config.yaml"])
    assert validate_data(config)["metrics"]["address"] == "0.0.0.0"


# ---- the DRA plugin's overlay (packaging/kubernetes/dra) ----------------------------------

DRA = MANIFESTS.parent / "dra"
# resource.k8s.io/v1 is GA from 1.34.
DRA_VERSIONS = ("1.34.0", str(kv.latest_version()))
# NVIDIA's DeviceClasses (its Helm chart's selectors, word for word): claims written for
# NVIDIA's driver select hostagent's devices through them.
NVIDIA_CLASSES = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    "vfio.gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"}
DRA_COMMAND = ("hostagent", "dra-plugin")
DRA_PATHS = {"/run/hostagent": True, "/var/lib/kubelet/plugins_registry": False,
             "/var/lib/kubelet/plugins/gpu.nvidia.com": False}


# The overlay's own files (its patch of the agent's DaemonSet is checked as rendered).
DRA_FILES = ("deviceclasses.yaml", "rbac.yaml", "daemonset.yaml", "webhook.yaml")


def dra_documents() -> list[tuple[str, dict]]:
    return [(name, doc) for name in DRA_FILES for doc in yaml.safe_load_all((DRA / name).read_text()) if doc]


def dra_kind(name: str) -> list[dict]:
    return [doc for _, doc in dra_documents() if doc["kind"] == name]


@pytest.mark.parametrize("version", DRA_VERSIONS)
@pytest.mark.parametrize("name, doc", dra_documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_dra_manifest_is_valid_for_kubernetes(name, doc, version):
    kv.validate(doc, version, strict=True)


def test_dra_overlay_lists_its_manifests_and_the_same_image():
    kustomization = yaml.safe_load((DRA / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted({"../base", *DRA_FILES})
    assert sorted(p.name for p in DRA.glob("*.yaml")) == sorted(
        {*DRA_FILES, "kustomization.yaml", *(p["path"] for p in kustomization["patches"])})
    assert kustomization["images"] == [{"name": "localhost/hostagent", "newTag": __version__}]
    [container] = dra_kind("DaemonSet")[0]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]


def test_the_device_classes_are_nvidias():
    classes = {d["metadata"]["name"]: d["spec"] for d in dra_kind("DeviceClass")}
    assert {n: [s["cel"]["expression"] for s in spec["selectors"]] for n, spec in classes.items()} == {
        n: [e] for n, e in NVIDIA_CLASSES.items()}
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"


def test_the_dra_plugin_may_keep_slices_and_read_claims_and_its_node_and_nothing_else():
    [role] = dra_kind("ClusterRole")
    assert {(r["apiGroups"][0], r["resources"][0]): sorted(r["verbs"]) for r in role["rules"]} == {
        ("resource.k8s.io", "resourceslices"): ["create", "delete", "get", "list", "update", "watch"],
        ("resource.k8s.io", "resourceclaims"): ["get"],
        ("", "nodes"): ["get"]}
    [binding] = dra_kind("ClusterRoleBinding")
    [account] = dra_kind("ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "hostagent"}]
    spec = dra_kind("DaemonSet")[0]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    # The agent's own service account stays without any API access.
    assert account["metadata"]["name"] != kind("ServiceAccount")["metadata"]["name"]


def test_the_dra_plugin_runs_beside_the_agent_without_privilege():
    spec = dra_kind("DaemonSet")[0]["spec"]["template"]["spec"]
    agent = kind("DaemonSet")["spec"]["template"]["spec"]
    assert spec["affinity"] == agent["affinity"] and spec["tolerations"] == agent["tolerations"]
    [container] = spec["containers"]
    assert tuple(container["command"]) == DRA_COMMAND
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = {host_paths[m["name"]]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == DRA_PATHS
    assert all(m["mountPath"] == host_paths[m["name"]] for m in container["volumeMounts"])
    assert not any("mountPropagation" in m for m in container["volumeMounts"])
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
