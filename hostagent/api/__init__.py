"""The local API: HTTP/1.1 + JSON on a UNIX socket, described by ``openapi.json``."""
