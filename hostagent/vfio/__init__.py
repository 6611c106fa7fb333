"""VFIO passthrough: a whole GPU (and every function of its IOMMU group) moved from the
nvidia driver to vfio-pci for a virtual machine, and back. ``pci`` reads the bus, ``plan``
decides (pure), ``executor`` writes the kernel's attributes, journaled, ``ledger`` records
the GPUs the agent moved until they are back, ``cdi`` gives the group's device nodes."""
