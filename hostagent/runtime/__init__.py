"""Container runtime integration.

    engine      the interface: add runtime, set default, enable CDI, render
    containerd, crio, docker
                one module per engine (tomledit: comment-preserving TOML edits;
                containerd_imports: the files containerd loads and the CRI section
                they leave it with)
    configure   the engines by name; plan (read, render, diff) and apply, revert
    files       reading (each file once), all-or-nothing writes with race checks
    backups     each file as it was before hostagent, for revert
    restart     systemd, or SIGHUP to containerd
    requests    GPU requests of an OCI config (annotations, mount markers, env)
    shim        the Python part of hostagent-runtime (ocijson: its JSON without
                import json); front: its sh front
"""
