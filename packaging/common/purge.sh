# What the agent wrote on the host: its state, the node's and the allocations' CDI specs
# (the node's only when its hook is hostagent's), its node labels, the runtime shim front
# 'hostagent runtime install-shim' wrote, the readiness markers it published.
# A shared /dev/shm still mounted (sharing could not be stopped): detached first, so the MPS
# clients keep their files and the folder under it can go; nothing of another file system
# is removed.
if grep -qs ' /run/hostagent/mps/shm ' /proc/mounts; then
    umount -l /run/hostagent/mps/shm || true
fi
rm -rf --one-file-system /var/lib/hostagent /run/hostagent || echo "hostagent: /run/hostagent could not be removed whole" >&2
for spec in /etc/cdi/nvidia.com-gpu.json /var/run/cdi/nvidia.com-gpu.json; do
    if [ -f "$spec" ] && grep -qF 'hostagent.hooks.main' "$spec"; then
        rm -f "$spec"
    fi
done
rm -f /var/run/cdi/hostagent.io-allocation_*.json /var/run/cdi/.hostagent.io-allocation_*
rmdir --ignore-fail-on-non-empty /var/run/cdi 2>/dev/null || true
rm -f /etc/kubernetes/node-feature-discovery/features.d/hostagent
rmdir --ignore-fail-on-non-empty /etc/kubernetes/node-feature-discovery/features.d \
    /etc/kubernetes/node-feature-discovery /etc/kubernetes 2>/dev/null || true
shim=/usr/local/sbin/hostagent-runtime
if [ -f "$shim" ] && grep -qF "hostagent runtime install-shim" "$shim"; then
    rm -f "$shim"
fi
# Only the markers hostagent wrote: their first line says so (hostagent/driver/markers.py).
for marker in /run/nvidia/validations/*; do
    if [ -f "$marker" ] && [ "$(head -n 1 "$marker" 2>/dev/null)" = '# written by hostagent' ]; then
        rm -f "$marker"
    fi
done
if getent group hostagent >/dev/null; then
    groupdel hostagent || true
fi
