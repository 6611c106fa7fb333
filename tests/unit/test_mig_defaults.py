"""The bundled default config, generated from the GPUs present."""

from hostagent.mig.defaults import balanced_layout, default_spec

from .mig_records import A30, A100, A100_80, H100, H200, T4, gpu, inventory


def test_all_balanced_per_sku():
    got = {sku: balanced_layout(gpu(0, sku)) for sku in (A100, A100_80, A30, H100, H200)}
    assert got == {
        A100: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        A100_80: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        A30: {"1g.6gb": 2, "2g.12gb": 1},
        H100: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        H200: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    }


def test_homogeneous_node_gets_mig_parted_names_without_filters():
    spec = default_spec(inventory(*[gpu(i, A100) for i in range(8)]))
    assert list(spec.configs) == ["all-disabled", "all-enabled", "all-1g.5gb", "all-1g.5gb.me",
                                  "all-1g.10gb", "all-2g.10gb", "all-3g.20gb", "all-4g.20gb",
                                  "all-7g.40gb", "all-balanced"]
    counts = {name: dict(entries[0].mig_devices) for name, entries in spec.configs.items()}
    assert counts["all-1g.5gb"] == {"1g.5gb": 7} and counts["all-1g.5gb.me"] == {"1g.5gb+me": 1}
    assert counts["all-1g.10gb"] == {"1g.10gb": 4}        # the 2-memory-slice profile on 40GB
    assert all(e.device_filter == () and e.devices == "all" for es in spec.configs.values() for e in es)


def test_mixed_node_gets_one_filtered_entry_per_sku_that_has_the_profile():
    spec = default_spec(inventory(gpu(0, A100), gpu(1, A100_80), gpu(2, T4)))
    one_g_10 = spec.configs["all-1g.10gb"]
    assert [(str(e.device_filter[0]), dict(e.mig_devices)) for e in one_g_10] == \
        [("0x20B010DE", {"1g.10gb": 4}), ("0x20B210DE", {"1g.10gb": 7})]
    assert [str(e.device_filter[0]) for e in spec.configs["all-2g.10gb"]] == ["0x20B010DE"]
    assert [str(e.device_filter[0]) for e in spec.configs["all-enabled"]] == ["0x20B010DE", "0x20B210DE"]


def test_node_without_mig_gets_only_all_disabled():
    assert list(default_spec(inventory(gpu(0, T4), gpu(1, T4))).configs) == ["all-disabled"]


def test_a30_instance_counts_come_from_the_guide_not_from_nvml():
    # NVML reports wrong instanceCount values on A30 (mig.md 1.1); whatever it says, the
    # bundled config and the planner's limits use the true maxima (mig.md 3.4).
    from dataclasses import replace
    from hostagent.mig.planner import plan
    from hostagent.mig.spec import ConfigEntry, MigSpec
    from .mig_records import profiles
    wrong = tuple(replace(p, instances={"1g.6gb": 7, "2g.12gb": 1}.get(p.name, 3)) for p in profiles(A30))
    a30 = gpu(0, A30, enabled=True, table=wrong)
    spec = default_spec(inventory(a30))
    assert {n: dict(e[0].mig_devices) for n, e in spec.configs.items() if n.startswith("all-") and
            e[0].mig_devices} == {"all-1g.6gb": {"1g.6gb": 4}, "all-1g.6gb.me": {"1g.6gb+me": 1},
                                  "all-2g.12gb": {"2g.12gb": 2}, "all-2g.12gb.me": {"2g.12gb+me": 1},
                                  "all-4g.24gb": {"4g.24gb": 1},
                                  "all-balanced": {"1g.6gb": 2, "2g.12gb": 1}}
    two = plan(inventory(a30), MigSpec({"c": (ConfigEntry("all", True, (("2g.12gb", 2),)),)}))
    assert two.gpus[0].after.counts() == {"2g.12gb": 2}          # NVML's 1 would refuse it
