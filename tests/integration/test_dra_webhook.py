"""The DRA plugin's configuration decoding as a validating admission webhook: AdmissionReview
documents in, the plugin's own verdict out (NVIDIA's demo claims admitted, a bad GpuConfig
refused naming the field), served over TLS by ``hostagent dra-webhook``."""

from __future__ import annotations

import copy
import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from hostagent.plugins.dra.webhook import PATH, review
from tests.waiting import until

DEMOS = {d["demo"]: d["object"] for d in yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "data/dra/quickstart-claims.yaml").read_text())}
DRIVER = "gpu.nvidia.com"


def admission(obj: dict, operation: str = "CREATE") -> dict:
    """The AdmissionReview the API server sends for ``obj``."""
    group, version = obj["apiVersion"].split("/")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "kind": {"group": group, "version": version, "kind": obj["kind"]},
                        "resource": {"group": group, "version": version,
                                     "resource": obj["kind"].lower() + "s"},
                        "namespace": obj["metadata"].get("namespace"), "name": obj["metadata"]["name"],
                        "operation": operation, "userInfo": {"username": "someone"}, "object": obj,
                        "dryRun": False}}


def with_parameters(demo: str, parameters, driver: str = DRIVER) -> dict:
    """``demo``'s object with its first opaque configuration's parameters replaced."""
    obj = copy.deepcopy(DEMOS[demo])
    spec = obj["spec"]["spec"] if obj["kind"] == "ResourceClaimTemplate" else obj["spec"]
    spec["devices"]["config"][0]["opaque"] = {"driver": driver, "parameters": parameters}
    return obj


def verdict(obj: dict) -> dict:
    document = admission(obj)
    answer = review(document, DRIVER)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == document["request"]["uid"]
    return answer["response"]


@pytest.mark.parametrize("demo", sorted(DEMOS))
def test_nvidias_demo_claims_are_admitted(demo):
    response = verdict(DEMOS[demo])
    assert response == {"uid": response["uid"], "allowed": True}


GPU = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}


@pytest.mark.parametrize("parameters, message", [
    ({**GPU, "sharing": {"strategy": "Turbo"}},
     'spec.spec.devices.config[0].opaque.parameters.sharing.strategy: "Turbo" is not one of Exclusive, '
     "TimeSlicing, MPS"),
    ({**GPU, "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}},
     "spec.spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: 150 is "
     "not between 0 and 100"),
    ({**GPU, "apiVersion": "resource.nvidia.com/v1"},
     'spec.spec.devices.config[0].opaque.parameters.apiVersion: "resource.nvidia.com/v1" is not '
     "resource.nvidia.com/v1beta1"),
    ({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
      "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
     "spec.spec.devices.config[0].opaque.parameters.sharing"),
    ("GpuConfig", "spec.spec.devices.config[0].opaque.parameters"),
])
def test_a_bad_configuration_is_refused_naming_the_field(parameters, message):
    response = verdict(with_parameters("gpu-test5", parameters))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422 and message in response["status"]["message"], response


VFIO = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}
AT = "spec.spec.devices.config[0].opaque.parameters"


@pytest.mark.parametrize("iommu", [{"backendPolicy": "PreferIommuFD", "enableAPIDevice": True},
                                   {"backendPolicy": "LegacyOnly"}, {}, None])
def test_a_good_vfio_device_config_is_admitted(iommu):
    parameters = {**VFIO, **({"iommu": iommu} if iommu is not None else {})}
    assert verdict(with_parameters("gpu-test-vfio-config", parameters))["allowed"] is True


@pytest.mark.parametrize("parameters, message", [
    ({**VFIO, "iommu": {"backendPolicy": "IommuFDOnly"}},
     f"{AT}.iommu.backendPolicy: unknown IOMMU backend policy: IommuFDOnly, supported IOMMU backend policies: "
     "LegacyOnly, PreferIommuFD"),
    ({**VFIO, "iommu": {"enableAPIDevice": "yes"}}, f'{AT}.iommu.enableAPIDevice: "yes" is not true or false'),
    ({**VFIO, "iommu": {"backendPolicy": "LegacyOnly", "noiommu": True}},
     f"{AT}.iommu.noiommu: unknown field (known: backendPolicy, enableAPIDevice)"),
    ({**VFIO, "sharing": {"strategy": "Exclusive"}}, f"{AT}.sharing: unknown field (known: apiVersion, iommu, kind)"),
    ({**VFIO, "apiVersion": "resource.nvidia.com/v1"},
     f'{AT}.apiVersion: "resource.nvidia.com/v1" is not resource.nvidia.com/v1beta1'),
])
def test_a_bad_vfio_device_config_is_refused_naming_the_field(parameters, message):
    response = verdict(with_parameters("gpu-test-vfio-config", parameters))
    assert response["allowed"] is False
    assert response["status"] == {"code": 422, "reason": "Invalid", "message": message}, response


def test_every_problem_is_said_and_another_drivers_configuration_is_its_own():
    obj = with_parameters("gpu-test5", {**GPU, "sharing": {"strategy": "Turbo"}})
    obj["spec"]["spec"]["devices"]["config"][1]["opaque"]["parameters"]["kind"] = "CpuConfig"
    message = verdict(obj)["status"]["message"]
    assert "config[0]" in message and 'config[1].opaque.parameters.kind: "CpuConfig"' in message
    assert verdict(with_parameters("gpu-test5", "anything", driver="other.example.com"))["allowed"] is True


def test_a_claim_and_a_device_class_are_checked_where_their_configurations_are():
    claim = copy.deepcopy(DEMOS["gpu-test3"])
    claim["spec"]["devices"]["config"] = [{"opaque": {"driver": DRIVER, "parameters": {**GPU, "x": 1}}}]
    assert verdict(claim)["status"]["message"].startswith("spec.devices.config[0].opaque.parameters")
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "shared"},
                    "spec": {"config": [{"opaque": {"driver": DRIVER, "parameters": {
                        **GPU, "sharing": {"strategy": "Exclusive", "mpsConfig": {}}}}}]}}
    assert verdict(device_class)["status"]["message"].startswith(
        "spec.config[0].opaque.parameters.sharing.mpsConfig: only with strategy MPS")


# ---- served over TLS --------------------------------------------------------------------

@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (openssl), as cert-manager's issuer makes one."""
    import shutil
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=hostagent-dra-webhook.hostagent.svc", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(folder / "tls.key"), "-out", str(folder / "tls.crt")],
                   check=True, capture_output=True, timeout=60)
    return folder / "tls.crt", folder / "tls.key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def webhook(certificate, tmp_path):
    cert, key = certificate
    port = free_port()
    log = open(tmp_path / "webhook.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "hostagent.cli.main", "dra-webhook", "--tls-cert", str(cert),
                             "--tls-key", str(key), "--address", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    context = ssl.create_default_context(cafile=str(cert))

    def answering():
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return proc.poll() is not None      # stop waiting for one that exited
    try:
        until(answering, timeout=30, what=lambda: (tmp_path / "webhook.log").read_text())
        assert proc.poll() is None, (tmp_path / "webhook.log").read_text()
        yield port, context, proc, tmp_path / "webhook.log"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)


def post(port, context, body: bytes, path: str = PATH) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def test_the_webhook_answers_admission_reviews_over_tls(webhook):
    port, context, proc, log = webhook
    status, body = post(port, context, json.dumps(admission(DEMOS["gpu-test5"])).encode())
    assert status == 200 and json.loads(body)["response"]["allowed"] is True
    bad = admission(with_parameters("gpu-test-mps", {**GPU, "sharing": {"strategy": "Turbo"}}))
    status, body = post(port, context, json.dumps(bad).encode())
    response = json.loads(body)["response"]
    assert status == 200 and response["uid"] == bad["request"]["uid"] and response["allowed"] is False
    assert '.sharing.strategy: "Turbo" is not one of' in response["status"]["message"]
    # Not an AdmissionReview, another path: refused; the webhook goes on serving.
    assert post(port, context, b"[1, 2")[0] == 400
    assert post(port, context, b"{}", "/other")[0] == 404
    # Plain HTTP gets no answer: the API server speaks TLS only.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not s.recv(1024).startswith(b"HTTP/1.1 200")
    assert post(port, context, json.dumps(admission(DEMOS["gpu-test1"])).encode())[0] == 200
    assert "refused ResourceClaimTemplate gpu-test-mps/" in log.read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0


def test_a_missing_certificate_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hostagent.cli.main", "dra-webhook", "--tls-cert",
                           str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == (
        f"hostagent: error: {tmp_path / 'tls.crt'}: no such file (mount the webhook's Secret (tls.crt, tls.key), "
        "see docs/dra.md)\n")
