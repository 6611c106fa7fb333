"""The listing behind the suite's end-of-run check of the host's hostagent folders."""

import os

from tests.host_state import changes, listing


def test_an_untouched_folder_lists_the_same(tmp_path):
    (tmp_path / "run/sub").mkdir(parents=True)
    (tmp_path / "run/sub/a").write_text("a")
    (tmp_path / "run/link").symlink_to("sub/a")
    dirs = [str(tmp_path / "run"), str(tmp_path / "missing")]
    assert changes(listing(dirs), listing(dirs)) == []


def test_added_changed_and_removed_entries_are_named(tmp_path):
    run, etc = tmp_path / "run", tmp_path / "etc"
    run.mkdir()
    (run / "node.lock").write_text("")
    (run / "gone").write_text("x")
    (run / "link").symlink_to("node.lock")
    dirs = [str(run), str(etc)]
    before = listing(dirs)
    os.utime(run / "node.lock", ns=(1, 1))           # a lock taken and released: same size, new mtime
    (run / "gone").unlink()
    (run / "link").unlink()
    (run / "link").symlink_to("other")
    (etc / "cdi").mkdir(parents=True)                  # a folder that did not exist, and its entries
    (etc / "cdi/spec.json").write_text("{}")
    assert changes(before, listing(dirs)) == [
        f"added {etc}", f"added {etc}/cdi", f"added {etc}/cdi/spec.json",
        f"changed {run}/link", f"changed {run}/node.lock",
        f"removed {run}/gone"]
