"""Container runtime integration.

    engine      the interface: add runtime, set default, enable CDI, render
    containerd, crio, docker
                one module per engine (tomledit: comment-preserving TOML edits)
    configure   plan (read, render, diff) and apply, revert
    files       snapshots, all-or-nothing writes with race checks, backups
    restart     systemd, or SIGHUP to containerd
    requests    GPU requests of an OCI config (annotations, mount markers, env)
    shim        the Python part of hostagent-runtime; front: its sh front
"""
