# GPU sharing outlives the agent's service (each MPS daemon runs in a unit of its own): stop
# it before the package goes, so no daemon is left serving from /run/hostagent, no GPU stays
# in the compute mode MPS needed, and the MPS clients' shared /dev/shm is unmounted.
# Containers using MPS lose it (--force), as they would lose the agent anyway.
if [ -x /usr/bin/hostagent ] && { [ -f /etc/hostagent/sharing.yaml ] || [ -f /var/lib/hostagent/sharing.json ]; }; then
    /usr/bin/hostagent sharing off --force || echo "hostagent: GPU sharing was not stopped; see 'hostagent sharing status'" >&2
fi
