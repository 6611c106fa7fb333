"""A small HTTP server for Prometheus: ``GET /metrics`` on a TCP address, loopback by default.

A thread per connection (the standard library's ThreadingHTTPServer); each scrape costs one
``Exporter.render()``, which only formats the last snapshot.
"""

from __future__ import annotations

import logging
import threading

from ..errors import UnavailableError

__all__ = ["MetricsServer"]

log = logging.getLogger("hostagent.metrics")


class MetricsServer:
    def __init__(self, exporter, address: str = "127.0.0.1", port: int = 9400,
                 config_file: str = "/etc/hostagent/config.yaml"):
        self.exporter = exporter
        self.config_file = config_file         # where metrics.port is set: named by the busy-port hint
        self.address = address
        self.requested_port = port
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self._server.server_address[1]

    def start(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from .exposition import CONTENT_TYPE
        exporter = self.exporter

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                try:
                    body = exporter.render()
                except Exception:
                    log.exception("rendering metrics failed")
                    self.send_error(500)
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt, *args):    # scrapes are not news
                log.debug("metrics %s: " + fmt, self.client_address[0], *args)

        try:
            self._server = ThreadingHTTPServer((self.address, self.requested_port), Handler)
        except OSError as e:
            raise UnavailableError(f"cannot listen on {self.address}:{self.requested_port}: {e.strerror}",
                                   hint=f"choose another metrics.port in {self.config_file}, "
                                        "or stop what holds it (dcgm-exporter uses 9400 too)") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hostagent-metrics-http",
                                        kwargs={"poll_interval": 0.5}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
