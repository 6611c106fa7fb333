"""The daemon's command-line flags, shared by ``hostagentd`` and ``hostagent serve``
(import-light: the CLI builds its parser from this at every start)."""

from __future__ import annotations

__all__ = ["add_arguments"]


def add_arguments(parser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="configuration file (default: /etc/hostagent/config.yaml)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        help="overrides daemon.log_level")
