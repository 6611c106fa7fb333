"""The OCI hook program (``hostagent-hook``): links and linker cache inside a container root.

Kept import-light on purpose: it runs at every container start. Only the standard library
and this package's own modules may be imported from here.
"""
