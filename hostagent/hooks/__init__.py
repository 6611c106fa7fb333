"""The OCI hook program (``hostagent-hook``): links and linker cache inside a container root.

Kept import-light on purpose: it runs at every container start. Only the standard library
and this package's own modules may be imported from here. The modules on the way of a
container start use ``posix`` rather than ``os``: ``python3 -S`` does not load ``os``, and
importing it (with ``posixpath``, ``stat`` and ``_collections_abc``) costs about a
millisecond, a tenth of the interpreter's own start. The sandbox, needed only where ldconfig
builds the cache, uses ``os`` and ``ctypes`` freely.
"""
