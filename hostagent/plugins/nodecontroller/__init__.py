"""``hostagent node-controller``: the cluster drives the node (its MIG layout, its sharing, its
driver version), and hears what is wrong with it.

One per node, a consumer of the agent's local API and of the Kubernetes API (never NVML):

    watcher      one watch on the node's own Node (and the ConfigMap, the Leases), resumed, never polled
    migplan      pure: the node's labels + the agent's plan -> what to do about MIG
    sharingplan  pure: the label + the configs folder -> which sharing config
    healthplan   pure: the agent's health -> Events, the GPUUnhealthy condition, the taint
    upgradeplan  pure: the fleet's driver version + the Node + the agent + its slot -> the walk's next step
    gpupods      pure: which pods of the node a driver upgrade moves off it
    slots        the Lease slots of driver upgrades: judged (pure), taken, renewed, released
    configs      the files named on the command line (ConfigMaps mounted as folders)
    writer       label/annotation/spec patches with resourceVersion and 409 retry
    events       an Event recorder counting repeats in one Event, as Kubernetes' own does
    cordon       cordon and uncordon, remembering its own cordon in an annotation
    evict        pods evicted through the Eviction API, 429s retried until a timeout
    holders      which pods hold an agent allocation
    clearing     devices in use cleared for a change: cordon, evict, uncordon (--on-busy evict)
    context      what the parts share
    mig          MIG by label: a pass of the plan, the state, the apply
    sharing      sharing by label: the same for the sharing config
    health       the faults reported: Events, condition, taint, on a thread of its own
    upgrade      driver upgrades across the fleet: the walk's steps, on a thread of its own
    controller   the loop composing them (dryrun: one pass printed, nothing written)
"""
