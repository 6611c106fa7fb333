"""In-root path resolution: chroot semantics by descriptor, whatever symlinks the image plants."""

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostagent.hooks.errors import HookError
from hostagent.hooks.inroot import MAX_HOPS, MAX_STEPS, Root, split


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
    for path, why in (("/", "is the host's /"), ("//", "is the host's /"), ("/usr/..", "climbs out with '..'"),
                      (str(tmp_path / "slash"), "passes through a symlink"),
                      (str(tmp_path / "slash" / "."), "passes through a symlink")):
        with pytest.raises(HookError, match=why):
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


def test_split_names_the_parent_and_the_final_name_is_not_followed(world):
    root, outside = world
    (root / "usr" / "lib" / "libcuda.so").symlink_to(str(outside))
    with Root(str(root)) as r:
        folder, name = split("/usr/lib/libcuda.so")
        assert (fd_path(r.opendir("/".join(folder))), name) == (str(root / "usr" / "lib"), "libcuda.so")
        for bad in ("/", "/usr/..", "", "/."):
            with pytest.raises(HookError, match="does not name a file"):
                split(bad)
        with pytest.raises(HookError, match="longer than 255 bytes"):
            split("/usr/lib/" + "x" * 256)
        assert split("/usr/./lib/../" + "x" * 255) == (["usr", "lib", ".."], "x" * 255)


def test_probe_creates_nothing_and_finds_what_create_would_hit(world):
    root, _ = world
    (root / "etc" / "passwd").write_text("")
    (root / "usr" / "lib" / "loop").symlink_to("loop")
    before = sorted(str(p) for p in root.rglob("*"))
    # Creating costs a missing name two steps (mkdir, then open): the probe counts the same.
    longest, too_long = "/new{}/a" + "/." * (MAX_STEPS - 5), "/new{}/a" + "/." * (MAX_STEPS - 4)
    with Root(str(root)) as r:
        assert fd_path(r.probe("/usr/lib")) == str(root / "usr" / "lib")
        assert r.probe("/new/dir/../sub") is None
        assert r.probe("/new/../usr/lib/new") is None
        assert r.probe(longest.format(1)) is None
        # Past a missing directory and back out of it with "..", the walk goes on for real.
        for path in ("/new/../etc/passwd/x", "/new/a/b/../../../etc/passwd/x", "/usr/new/../../etc/passwd/x"):
            with pytest.raises(NotADirectoryError):
                r.probe(path)
        for path, code in (("/new/../usr/lib/loop/x", errno.ELOOP), ("/new/" + "x" * 256, errno.ENAMETOOLONG),
                           (too_long.format(1), errno.ENAMETOOLONG)):
            with pytest.raises(OSError) as info:
                r.probe(path)
            assert info.value.errno == code
        assert sorted(str(p) for p in root.rglob("*")) == before
        os.close(r.opendir(longest.format(2), create=True))
        with pytest.raises(OSError) as info:
            r.opendir(too_long.format(3), create=True)
        assert info.value.errno == errno.ENAMETOOLONG


# A random image: directories, files and symlinks with hostile texts, then random lookups.
names = st.sampled_from(["a", "b", "lib", "etc", "..", ".", "proc"])
link_texts = st.lists(names, min_size=0, max_size=6).map("/".join).flatmap(
    lambda rel: st.sampled_from([rel, "/" + rel, "OUTSIDE/" + rel, "/proc/1/root/" + rel]))
entries = st.lists(st.tuples(st.lists(st.sampled_from(["a", "b", "lib", "etc"]), min_size=1, max_size=3),
                             link_texts), max_size=6)
files = st.lists(st.lists(st.sampled_from(["a", "b", "lib", "etc"]), min_size=1, max_size=3), max_size=2)


def build_image(base, links, files=()):
    """base/root holding ``links`` (parts, text) and regular ``files`` (parts), built without
    ever following a link; base/outside must stay untouched."""
    root, outside = base / "root", base / "outside"
    root.mkdir()
    (outside / "lib").mkdir(parents=True)
    for parts, text in [*links, *((parts, None) for parts in files)]:
        path = root
        for part in parts[:-1]:
            path = path / part
            if path.is_symlink() or path.is_file():
                break
            path.mkdir(exist_ok=True)
        else:
            path = path / parts[-1]
            if os.path.lexists(path):
                continue
            if text is None:
                path.write_text("")
            else:
                path.symlink_to(text.replace("OUTSIDE", str(outside)) or ".")
    return root, outside


def tree(base) -> list[str]:
    return sorted(os.path.join(d, n) for d, dirs, names in os.walk(base) for n in dirs + names)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(links=entries, lookups=st.lists(link_texts, min_size=1, max_size=4), create=st.booleans())
def test_no_image_layout_resolves_outside_the_root(tmp_path_factory, links, lookups, create):
    root, outside = build_image(tmp_path_factory.mktemp("image"), links)
    with Root(str(root)) as r:
        for text in lookups:
            try:
                resolved = fd_path(r.opendir(text.replace("OUTSIDE", str(outside)), create=create))
            except OSError:
                continue
            assert resolved == str(root) or resolved.startswith(str(root) + "/"), (links, text)
    assert sorted(p.name for p in outside.iterdir()) == ["lib"] and not any((outside / "lib").iterdir())


def outcome(walk):
    try:
        fd = walk()
    except OSError as e:
        return ("error", e.errno)
    return ("missing", None) if fd is None else ("found", fd_path(fd))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(links=entries, files=files, lookups=st.lists(link_texts, min_size=1, max_size=4))
def test_probe_predicts_create_and_writes_nothing(tmp_path_factory, links, files, lookups):
    base = tmp_path_factory.mktemp("image")
    root, outside = build_image(base, links, files)
    with Root(str(root)) as r:
        for text in lookups:
            path = text.replace("OUTSIDE", str(outside))
            before = tree(base)
            probed = outcome(lambda: r.probe(path))
            assert tree(base) == before, (links, files, text)
            created = outcome(lambda: r.opendir(path, create=True))
            if probed[0] == "missing":
                assert created[0] == "found", (links, files, text, created)
            else:
                assert probed == created, (links, files, text)
