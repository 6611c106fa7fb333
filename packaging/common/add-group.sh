# The API's group: its members may read the inventory and prepare allocations (docs/api.md).
if ! getent group hostagent >/dev/null; then
    groupadd --system hostagent || echo "hostagent: could not create the group 'hostagent'; the API socket stays root-only" >&2
fi
