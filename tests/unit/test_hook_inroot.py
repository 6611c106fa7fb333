"""In-root path resolution: chroot semantics by descriptor, whatever symlinks the image plants."""

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostagent.hooks.errors import HookError
from hostagent.hooks.inroot import MAX_HOPS, Root


def fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


@pytest.fixture
def world(tmp_path):
    """tmp/outside (must never be reached) next to tmp/root (the container root)."""
    (tmp_path / "outside" / "usr" / "lib").mkdir(parents=True)
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "etc").mkdir()
    return root, tmp_path / "outside"


def test_the_host_root_is_refused_however_it_is_named(tmp_path):
    (tmp_path / "slash").symlink_to("/")
    for path in ("/", "//", "/usr/..", str(tmp_path / "slash"), str(tmp_path / "slash" / ".")):
        with pytest.raises(HookError, match="is the host's /"):
            Root(path)


def test_missing_and_non_directory_roots_are_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(HookError, match="does not exist"):
        Root(str(tmp_path / "missing"))
    with pytest.raises(HookError, match="not a directory"):
        Root(str(tmp_path / "file"))


@pytest.mark.parametrize("link_text", [
    "OUTSIDE/usr/lib",                 # absolute host path
    "../../../../../../../../../..",   # climbing out
    "/proc/self/root",                 # a magic link's text
    "/../../..",
    "../../etc/../../../..",
])
def test_symlinks_resolve_inside_the_root(world, link_text):
    root, outside = world
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to(link_text.replace("OUTSIDE", str(outside)))
    with Root(str(root)) as r:
        resolved = fd_path(r.opendir("/usr/lib/x86_64-linux-gnu", create=True))
    assert resolved == str(root) or resolved.startswith(str(root) + "/")
    assert os.listdir(outside / "usr" / "lib") == []


def test_absolute_targets_restart_at_the_root_and_relative_ones_at_the_link(world):
    root, outside = world
    (root / "opt").mkdir()
    (root / "usr" / "lib" / "abs").symlink_to("/opt")
    (root / "usr" / "lib" / "rel").symlink_to("../../etc")
    with Root(str(root)) as r:
        assert fd_path(r.opendir("/usr/lib/abs")) == str(root / "opt")
        assert fd_path(r.opendir("usr/lib/rel")) == str(root / "etc")
        assert fd_path(r.opendir("/../../usr/./lib/../..")) == str(root)


def test_dotdot_after_a_symlink_is_the_parent_of_its_target(world):
    root, _ = world
    (root / "a" / "b").mkdir(parents=True)
    (root / "usr" / "lib" / "jump").symlink_to("/a/b")
    with Root(str(root)) as r:
        assert fd_path(r.opendir("/usr/lib/jump/..")) == str(root / "a")


def test_link_loops_and_long_chains_stop_with_eloop(world):
    root, _ = world
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("/loop1")
    for i in range(MAX_HOPS + 1):
        (root / f"c{i}").symlink_to(f"c{i + 1}")
    (root / f"c{MAX_HOPS + 1}").mkdir()
    with Root(str(root)) as r:
        for path in ("/loop1/x", "/c0"):
            with pytest.raises(OSError) as info:
                r.opendir(path)
            assert info.value.errno == errno.ELOOP
        os.close(r.opendir("/c1"))             # 40 hops: still fine


def test_a_file_in_the_middle_is_not_a_directory(world):
    root, _ = world
    (root / "etc" / "passwd").write_text("")
    with Root(str(root)) as r, pytest.raises(NotADirectoryError):
        r.opendir("/etc/passwd/x")


def test_create_makes_missing_directories_inside_even_through_dangling_links(world):
    root, outside = world
    (root / "usr" / "lib" / "dangling").symlink_to(f"{outside}/new/dir")
    with Root(str(root)) as r:
        assert fd_path(r.opendir("/usr/lib/dangling/sub", create=True)) == f"{root}{outside}/new/dir/sub"
        with pytest.raises(FileNotFoundError):
            r.opendir("/not/there")
    assert not (outside / "new").exists()
    made = root / str(outside).lstrip("/") / "new" / "dir" / "sub"
    assert made.is_dir() and oct(made.stat().st_mode & 0o777) == "0o755"


def test_parent_does_not_follow_the_final_name(world):
    root, outside = world
    (root / "usr" / "lib" / "libcuda.so").symlink_to(str(outside))
    with Root(str(root)) as r:
        fd, name = r.parent("/usr/lib/libcuda.so")
        assert (fd_path(fd), name) == (str(root / "usr" / "lib"), "libcuda.so")
        for bad in ("/", "/usr/..", "", "/."):
            with pytest.raises(HookError, match="does not name a file"):
                r.parent(bad)


# A random image: directories and symlinks with hostile texts, then random lookups.
names = st.sampled_from(["a", "b", "lib", "etc", "..", ".", "proc"])
link_texts = st.lists(names, min_size=0, max_size=6).map("/".join).flatmap(
    lambda rel: st.sampled_from([rel, "/" + rel, "OUTSIDE/" + rel, "/proc/1/root/" + rel]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(links=st.lists(st.tuples(st.lists(st.sampled_from(["a", "b", "lib", "etc"]), min_size=1, max_size=3),
                                 link_texts), max_size=6),
       lookups=st.lists(link_texts, min_size=1, max_size=4),
       create=st.booleans())
def test_no_image_layout_resolves_outside_the_root(tmp_path_factory, links, lookups, create):
    base = tmp_path_factory.mktemp("image")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    (outside / "lib").mkdir(parents=True)
    for parts, text in links:                # built without ever following a link
        path = root
        for part in parts[:-1]:
            path = path / part
            if path.is_symlink():
                break
            path.mkdir(exist_ok=True)
        else:
            path = path / parts[-1]
            if not os.path.lexists(path):
                path.symlink_to(text.replace("OUTSIDE", str(outside)) or ".")
    with Root(str(root)) as r:
        for text in lookups:
            try:
                resolved = fd_path(r.opendir(text.replace("OUTSIDE", str(outside)), create=create))
            except OSError:
                continue
            assert resolved == str(root) or resolved.startswith(str(root) + "/"), (links, text)
    assert sorted(p.name for p in outside.iterdir()) == ["lib"] and not any((outside / "lib").iterdir())
