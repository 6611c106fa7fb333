"""``hostagent dra-webhook``: the DRA plugin's configuration decoding as a validating
admission webhook (``plugins/dra/webhook.py``)."""

from __future__ import annotations

__all__ = ["register"]


def _port(text: str) -> int:
    import argparse
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def register(sub) -> None:
    from .dra_plugin import DRIVER, _driver
    p = sub.add_parser(
        "dra-webhook", help="refuse resource claims whose GPU configuration the DRA plugin would refuse",
        description="A validating admission webhook over HTTPS: ResourceClaims, ResourceClaimTemplates and "
                    "DeviceClasses whose opaque GpuConfig or MigDeviceConfig for the driver the DRA plugin "
                    "would refuse are refused when they are created, with the plugin's message. Runs until "
                    "SIGTERM. See docs/dra.md.")
    p.add_argument("--tls-cert", required=True, metavar="FILE", help="the server's certificate (PEM)")
    p.add_argument("--tls-key", required=True, metavar="FILE", help="its private key (PEM)")
    p.add_argument("--address", default="0.0.0.0", help="the address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=_port, default=8443, help="the port to listen on (default 8443)")
    p.add_argument("--driver-name", type=_driver, default=DRIVER, metavar="NAME",
                   help=f"the DRA driver whose configurations are checked (default {DRIVER})")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.set_defaults(run=run)


def _stop(signum, frame):
    raise KeyboardInterrupt          # SIGTERM stops the server as Ctrl-C does


def run(args) -> int:
    import errno
    import signal
    import ssl
    from ..daemon.logs import setup_logging
    from ..errors import ConfigError, StateError
    from ..plugins.dra.webhook import serve
    setup_logging(args.log_level, identifier="hostagent-dra-webhook")
    signal.signal(signal.SIGTERM, _stop)
    try:
        serve(args.address, args.port, args.tls_cert, args.tls_key, args.driver_name)
    except ssl.SSLError as e:
        raise ConfigError(f"not a usable certificate and key: {e.reason or e}", where=args.tls_cert,
                          hint="give the PEM files of the webhook's Secret (tls.crt, tls.key)") from None
    except FileNotFoundError as e:
        raise ConfigError("no such file", where=e.filename or args.tls_cert,
                          hint="mount the webhook's Secret (tls.crt, tls.key), see docs/dra.md") from None
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise StateError(f"cannot listen on {args.address}:{args.port}: {e.strerror}",
                             hint="choose another --port") from None
        raise
    except KeyboardInterrupt:
        pass
    return 0
