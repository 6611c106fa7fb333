"""``hostagent node-controller``: the cluster drives the node, and hears what is wrong with it.

One per node, a consumer of the agent's local API and of the Kubernetes API (never NVML):

    watcher      one watch on the node's own Node, resumed, never polled
    migplan      pure: the node's labels + the agent's plan -> what to do about MIG
    sharingplan  pure: the label + the configs folder -> which sharing config
    healthplan   pure: the agent's health -> Events, the GPUUnhealthy condition, the taint
    configs      the files named on the command line (ConfigMaps mounted as folders)
    writer       label/annotation/spec patches with resourceVersion and 409 retry
    events       an Event recorder counting repeats in one Event, as Kubernetes' own does
    cordon       cordon and uncordon, remembering its own cordon in an annotation
    evict        pods evicted through the Eviction API, 429s retried until a timeout
    holders      which pods hold an agent allocation
    context      what the parts share; clearing devices in use (cordon, evict, uncordon)
    mig          MIG by label: a pass of the plan, the state, the apply
    sharing      sharing by label: the same for the sharing config
    health       the faults reported: Events, condition, taint, on a thread of its own
    controller   the loop composing them (dryrun: one pass printed, nothing written)
"""
