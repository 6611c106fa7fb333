"""--link: what happens at LINK in every case, and the atomic file helpers under it."""

import os
import posix

import pytest

from hostagent.hooks import fileat
from hostagent.hooks.errors import HookError
from hostagent.hooks.inroot import Root
from hostagent.hooks.links import create_links

LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def root(tmp_path):
    (tmp_path / "root" / LIB.lstrip("/")).mkdir(parents=True)
    with Root(str(tmp_path / "root")) as r:
        yield r


def lib(root, name=""):
    return os.path.join(root.path, LIB.lstrip("/"), name)


def run(root, *links):
    warnings = []
    counts = create_links(root, [tuple(link.split("::")) for link in links], warnings.append)
    return counts, warnings


def test_links_are_created_with_their_targets_verbatim(root):
    counts, warnings = run(root, f"libcuda.so.550.54.15::{LIB}/libcuda.so.1", f"libcuda.so.1::{LIB}/libcuda.so",
                           f"/etc/../../../../etc/shadow::{LIB}/abs", f"../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so")
    assert counts == {"created": 4, "replaced": 0, "unchanged": 0, "kept": 0} and warnings == []
    assert os.readlink(lib(root, "libcuda.so.1")) == "libcuda.so.550.54.15"
    assert os.readlink(lib(root, "libcuda.so")) == "libcuda.so.1"
    assert os.readlink(lib(root, "abs")) == "/etc/../../../../etc/shadow"     # stored, never followed
    assert os.readlink(lib(root, "gbm/nvidia-drm_gbm.so")) == "../libnvidia-allocator.so.1"
    assert oct(os.stat(lib(root, "gbm")).st_mode & 0o777) == "0o755"


def test_a_correct_link_is_not_touched_and_a_wrong_one_is_replaced_atomically(root):
    os.symlink("libcuda.so.1", lib(root, "libcuda.so"))
    os.symlink("libcuda.so.470.1", lib(root, "libcuda.so.1"))
    before = {n: os.lstat(lib(root, n)).st_ino for n in ("libcuda.so", "libcuda.so.1")}
    counts, _ = run(root, f"libcuda.so.1::{LIB}/libcuda.so", f"libcuda.so.550.54.15::{LIB}/libcuda.so.1")
    assert counts["unchanged"] == 1 and counts["replaced"] == 1
    assert os.lstat(lib(root, "libcuda.so")).st_ino == before["libcuda.so"]
    assert os.lstat(lib(root, "libcuda.so.1")).st_ino != before["libcuda.so.1"]
    assert os.readlink(lib(root, "libcuda.so.1")) == "libcuda.so.550.54.15"
    assert sorted(os.listdir(lib(root))) == ["libcuda.so", "libcuda.so.1"]      # no temp names left


def test_regular_files_and_directories_at_link_are_kept_with_a_warning(root):
    with open(lib(root, "libcuda.so.1"), "w") as f:
        f.write("the image's own file")
    os.mkdir(lib(root, "libcuda.so"))
    counts, warnings = run(root, f"libcuda.so.550::{LIB}/libcuda.so.1", f"libcuda.so.1::{LIB}/libcuda.so")
    assert counts["kept"] == 2
    assert warnings == [f"{LIB}/libcuda.so.1 exists and is not a symlink; left as it is, not linked to libcuda.so.550",
                        f"{LIB}/libcuda.so is a directory; left as it is, not linked to libcuda.so.1"]
    assert open(lib(root, "libcuda.so.1")).read() == "the image's own file"


def test_a_link_whose_parent_is_a_file_fails_clearly_before_any_link_is_made(root):
    with open(lib(root, "file"), "w"):
        pass
    for bad in (f"{LIB}/file/x", f"/missing/..{LIB}/file/x", f"/missing/a/../..{LIB}/file/x"):
        with pytest.raises(HookError, match=f"cannot reach the directory of link {bad} in the container: not a directory"):
            run(root, f"libcuda.so.550::{LIB}/libcuda.so.1", "t::/etc/new/x", f"t::{bad}")
        assert sorted(os.listdir(lib(root))) == ["file"]
        assert sorted(os.listdir(root.path)) == ["usr"]               # not even a parent directory


def test_a_new_link_is_made_in_one_step_and_a_changed_one_renamed_into_place(root, monkeypatch):
    made, renamed = [], []
    real_symlink, real_rename = posix.symlink, posix.rename
    monkeypatch.setattr(posix, "symlink",
                        lambda target, name, **kw: (made.append(name), real_symlink(target, name, **kw)))
    monkeypatch.setattr(posix, "rename", lambda a, b, **kw: (renamed.append((a, b)), real_rename(a, b, **kw)))
    counts, _ = run(root, f"libcuda.so.550::{LIB}/libcuda.so.1")
    assert counts["created"] == 1 and made == ["libcuda.so.1"] and renamed == []
    made.clear()
    counts, _ = run(root, f"libcuda.so.560::{LIB}/libcuda.so.1")
    assert counts["replaced"] == 1
    [tmp] = made
    assert tmp.startswith(".libcuda.so.1.hostagent-") and renamed == [(tmp, "libcuda.so.1")]
    assert sorted(os.listdir(lib(root))) == ["libcuda.so.1"]
    assert os.readlink(lib(root, "libcuda.so.1")) == "libcuda.so.560"


def test_write_at_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("host data")
    d = tmp_path / "etc"
    d.mkdir()
    (d / "ld.so.cache").symlink_to(victim)
    fd = os.open(d, os.O_PATH | os.O_DIRECTORY)
    try:
        fileat.write_at(fd, "ld.so.cache", b"new cache")
        assert fileat.read_at(fd, "ld.so.cache", 100) == b"new cache"
    finally:
        os.close(fd)
    assert victim.read_text() == "host data" and not (d / "ld.so.cache").is_symlink()
    assert oct((d / "ld.so.cache").stat().st_mode & 0o777) == "0o644"


def test_temp_names_are_random_and_never_reused(tmp_path, monkeypatch):
    names = {fileat.temp_name("ld.so.cache") for _ in range(100)}
    assert len(names) == 100 and all(n.startswith(".ld.so.cache.hostagent-") for n in names)
    assert len(os.fsencode(fileat.temp_name("é" * 127))) <= 255          # the longest name split allows
    # A planted entry at the temporary name is not followed or overwritten: O_EXCL fails.
    (tmp_path / ".x.hostagent-planted").symlink_to(tmp_path / "victim")
    monkeypatch.setattr(fileat, "temp_name", lambda name: ".x.hostagent-planted")
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(FileExistsError):
            fileat.write_at(fd, "x", b"data")
    finally:
        os.close(fd)
    assert not (tmp_path / "victim").exists() and not (tmp_path / "x").exists()


def test_read_at_ignores_links_and_fifos(tmp_path):
    (tmp_path / "real").write_text("ok")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        assert fileat.read_at(fd, "real", 10) == b"ok"
        assert fileat.read_at(fd, "link", 10) is None
        assert fileat.read_at(fd, "fifo", 10) is None          # and it did not block
        assert fileat.read_at(fd, "missing", 10) is None
        assert fileat.exists_at(fd, "link") and not fileat.exists_at(fd, "missing")
    finally:
        os.close(fd)


def test_links_sharing_a_folder_and_dotted_spellings_land_where_they_say(root):
    counts, _ = run(root, f"t1::{LIB}/gbm/.", f"t2::{LIB}/gbm/x", f"t3::{LIB}/./y", f"t4::{LIB}/../x86_64-linux-gnu/z",
                    "t5::usr/lib/x86_64-linux-gnu/w")
    assert counts["created"] == 5
    assert os.readlink(lib(root, "gbm")) == "t1"                  # "/gbm/." names gbm itself
    assert os.readlink(lib(root, "gbm/x")) == "t2"                # ... and so gbm/x goes through that link
    assert [os.readlink(lib(root, n)) for n in ("y", "z", "w")] == ["t3", "t4", "t5"]


def test_the_longest_file_name_is_linked(root):
    name = "é" * 127                                           # 254 bytes
    counts, _ = run(root, f"t::{LIB}/{name}")
    assert counts["created"] == 1 and os.listdir(lib(root)) == [name]
