"""The DRA plugin's configuration decoding as a validating admission webhook: a ResourceClaim,
ResourceClaimTemplate or DeviceClass whose opaque configuration for this driver the plugin
would refuse when a pod starts (``claims.parse_config``) is refused when it is created, with
the same one-line message naming the field. NVIDIA's DRA driver ships a webhook that does
this for its ``GpuConfig`` and ``MigDeviceConfig``.

``review(document, driver)`` is pure: an ``AdmissionReview`` request in, its response out.
``serve`` is the thin HTTPS server around it (``hostagent dra-webhook``): the API server
calls it over TLS only, at ``POST /validate-resource-claim-parameters``; ``GET /healthz``
is for the readiness probe.
"""

from __future__ import annotations

import json
import logging

from .claims import ClaimError, parse_config

__all__ = ["review", "problems", "serve", "PATH"]

log = logging.getLogger("hostagent.dra.webhook")

PATH = "/validate-resource-claim-parameters"
MAX_BODY = 3 * 1024 * 1024        # an AdmissionReview holds the object (at most 1.5 MiB) and its old copy


def _configs(kind: str, obj: dict) -> tuple[str, list]:
    """(where, the configs) of an object of ``kind``: a claim's and a class's lists."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if kind == "ResourceClaimTemplate":
        spec, where = (spec.get("spec") if isinstance(spec.get("spec"), dict) else {}), "spec.spec.devices.config"
    elif kind == "DeviceClass":
        return "spec.config", spec.get("config") or []
    else:
        where = "spec.devices.config"
    devices = spec.get("devices") if isinstance(spec.get("devices"), dict) else {}
    return where, devices.get("config") or []


def problems(kind: str, obj: dict, driver: str) -> list[str]:
    """What the plugin would refuse in ``obj``'s opaque configurations for ``driver``: one
    line each (another driver's configurations are that driver's to judge)."""
    where, configs = _configs(kind, obj)
    out = []
    for i, config in enumerate(configs if isinstance(configs, list) else []):
        opaque = config.get("opaque") if isinstance(config, dict) else None
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        at = f"{where}[{i}].opaque.parameters"
        try:
            parse_config(opaque.get("parameters"), at)
        except ClaimError as e:
            out.append(str(e))
        except (TypeError, AttributeError, ValueError):     # not the shape any config has
            out.append(f"{at}: not a {driver} configuration (an object with apiVersion, kind and sharing)")
    return out


def review(document: dict, driver: str) -> dict:
    """The ``AdmissionReview`` answering ``document``'s request: allowed, or refused with
    every problem of the object."""
    request = document.get("request") or {}
    found = problems((request.get("kind") or {}).get("kind", ""), request.get("object") or {}, driver)
    response: dict = {"uid": request.get("uid", ""), "allowed": not found}
    if found:
        response["status"] = {"code": 422, "reason": "Invalid", "message": "; ".join(found)}
    return {"apiVersion": document.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}


def serve(address: str, port: int, cert: str, key: str, driver: str, ready=None) -> None:
    """Serve ``review`` over HTTPS until interrupted; ``ready(server)`` once listening."""
    import ssl
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10

        def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/healthz":
                self._answer(200, b"ok\n", "text/plain")
            else:
                self._answer(404, b"not found\n", "text/plain")

        def do_POST(self):
            if self.path.split("?", 1)[0] != PATH:
                self._answer(404, b"not found\n", "text/plain")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self._answer(413 if length > MAX_BODY else 411, b"a body of at most 3 MiB, with its length\n",
                             "text/plain")
                return
            try:
                document = json.loads(self.rfile.read(length))
                if not isinstance(document, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                self._answer(400, f"not an AdmissionReview: {e}\n".encode(), "text/plain")
                return
            answer = review(document, driver)
            if not answer["response"]["allowed"]:
                request = document.get("request") or {}
                log.info("refused %s %s/%s: %s", (request.get("kind") or {}).get("kind"),
                         request.get("namespace") or "", request.get("name") or "",
                         answer["response"]["status"]["message"])
            self._answer(200, json.dumps(answer).encode())

        def log_message(self, fmt, *args):
            log.debug("%s: " + fmt, self.client_address[0], *args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self):
            sock, addr = super().get_request()
            sock.settimeout(10)             # a handshake that never ends holds one thread, for 10 s
            # The handshake happens at the first read, in the request's own thread.
            return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

        def handle_error(self, request, client_address):     # a failed handshake is one line
            import sys
            log.warning("connection from %s: %s", client_address[0], sys.exc_info()[1])

    with Server((address, port), Handler) as server:
        log.info("serving %s on https://%s:%d for driver %s", PATH, address, server.server_address[1], driver)
        if ready is not None:
            ready(server)
        server.serve_forever(poll_interval=0.5)
