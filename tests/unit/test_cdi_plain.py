"""Plain edits: what the hook would do, as mounts and device nodes a plugin can pass."""

from hostagent.cdi.edits import IPC_MOUNT_OPTIONS, LIBRARY_MOUNT_OPTIONS, DeviceNode, Edits, Mount
from hostagent.cdi.plain import plain_edits

LIB = "/usr/lib/x86_64-linux-gnu"


def edits():
    return Edits(
        env=("NVIDIA_VISIBLE_DEVICES=void",),
        device_nodes=(DeviceNode("/dev/nvidia0", "/host/dev/nvidia0", 195, 0, 0o666),
                      DeviceNode("/dev/dri/card1", "/host/dev/dri/card1", 226, 1, 0o660)),
        mounts=(Mount(f"/host{LIB}/libcuda.so.550.54.15", f"{LIB}/libcuda.so.550.54.15"),
                Mount("/host/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket", IPC_MOUNT_OPTIONS)),
        links=(("libcuda.so.550.54.15", f"{LIB}/libcuda.so.1"), ("libcuda.so.1", f"{LIB}/libcuda.so"),
               ("libgone.so.1", f"{LIB}/libgone.so")),
        device_links=(("../card1", "/dev/dri/by-path/pci-0000:3b:00.0-card"),
                      ("../card2", "/dev/dri/by-path/pci-0000:5e:00.0-card")),
        folders=(LIB,))


def test_links_become_mounts_of_the_library_and_nodes_at_the_link_path():
    plain = plain_edits(edits(), ["GPU-a", "GPU-b"])
    assert set(plain) == {"env", "deviceNodes", "mounts"}                   # no hooks, nothing else
    assert plain["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"]
    mounts = {m["containerPath"]: (m["hostPath"], m["options"]) for m in plain["mounts"]}
    library = (f"/host{LIB}/libcuda.so.550.54.15", list(LIBRARY_MOUNT_OPTIONS))
    assert mounts[f"{LIB}/libcuda.so.550.54.15"] == library
    assert mounts[f"{LIB}/libcuda.so.1"] == library                          # the SONAME
    assert mounts[f"{LIB}/libcuda.so"] == library                            # through the SONAME link
    assert "ro" in mounts[f"{LIB}/libcuda.so.1"][1]
    assert mounts["/run/nvidia-persistenced/socket"][1] == list(IPC_MOUNT_OPTIONS)
    assert f"{LIB}/libgone.so" not in mounts                                # its target is not injected
    nodes = {n["path"]: n["hostPath"] for n in plain["deviceNodes"]}
    assert nodes == {"/dev/nvidia0": "/host/dev/nvidia0", "/dev/dri/card1": "/host/dev/dri/card1",
                     "/dev/dri/by-path/pci-0000:3b:00.0-card": "/host/dev/dri/card1"}
