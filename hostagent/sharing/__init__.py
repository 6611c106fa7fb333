"""GPU sharing: MPS control daemons and time-slicing, from the device plugin's sharing config.

``config`` reads the file, ``resolve`` maps it onto the node's devices (every bad input is
refused there), ``plan`` diffs it against what is in force, ``executor`` applies the plan
(``mps`` for the daemons, NVML for compute modes, ``nvidia-smi compute-policy`` for
time-slices), ``state`` records what was done; ``service`` holds the operations the CLI and
the daemon share.
"""
