"""The caches' folders (``tilefuse/disk_cache.py``): on and off, where they live, and their bound on disk, least
recently used entries removed first."""

from __future__ import annotations

import os

import pytest

from tilefuse import disk_cache
from tilefuse.disk_cache import DiskCache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_TEST_CACHE_DIR", str(tmp_path / "entries"))
    monkeypatch.delenv("TILEFUSE_TEST_CACHE", raising=False)
    monkeypatch.delenv("TILEFUSE_CACHE_MAX_MB", raising=False)
    return DiskCache("TEST_CACHE", "test")


def test_entries_round_trip_and_the_settings_move_and_switch_it(cache, tmp_path, monkeypatch):
    assert cache.enabled() and cache.directory() == tmp_path / "entries"
    assert cache.read("a") is None
    cache.write("a", "text of a")
    assert cache.read("a") == "text of a" and cache.path("a").is_file()
    monkeypatch.setenv("TILEFUSE_TEST_CACHE", "0")
    assert not cache.enabled()
    monkeypatch.delenv("TILEFUSE_TEST_CACHE_DIR")
    assert cache.directory() == disk_cache.Path.home() / ".cache" / "tilefuse" / "test"


def _aged(cache, key: str, size: int, age: float) -> None:
    cache.path(key).parent.mkdir(parents=True, exist_ok=True)
    cache.path(key).write_text("x" * size)
    t = 1_000_000.0 - age
    os.utime(cache.path(key), (t, t))


def test_prune_removes_the_least_recently_used_down_to_keep_of_the_bound(cache):
    for i in range(10):  # entry 0 the oldest
        _aged(cache, f"e{i}", 1000, age=100 - i)
    (cache.directory() / "e.json.123.tmp").write_text("y" * 5000)  # another writer's temporary file
    (cache.directory() / "notes.txt").write_text("z" * 5000)
    assert disk_cache.prune(cache.directory(), 20_000) == 0  # under the bound: nothing goes
    assert disk_cache.prune(cache.directory(), 9_000) == 3  # 10 000 over 9 000: down to 7 200 (KEEP)
    left = sorted(p.name for p in cache.directory().iterdir())
    assert left == ["e.json.123.tmp", "e3.json", "e4.json", "e5.json", "e6.json", "e7.json", "e8.json", "e9.json",
                    "notes.txt"]


def test_a_read_marks_the_entry_used_so_it_outlives_older_writes(cache):
    for i in range(4):
        _aged(cache, f"e{i}", 1000, age=100 - i)
    assert cache.read("e0") == "x" * 1000  # the oldest, used now
    disk_cache.prune(cache.directory(), 3000)
    assert sorted(p.stem for p in cache.directory().iterdir()) == ["e0", "e3"]


def test_writes_hold_the_folder_to_the_bound(cache, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_MAX_MB", str(50_000 / (1 << 20)))  # 50 000 bytes
    for i in range(40):
        cache.write(f"k{i}", "v" * 2000)
        os.utime(cache.path(f"k{i}"), (1_000_000.0 + i, 1_000_000.0 + i))  # (distinct ages on any file system)
    total = sum(p.stat().st_size for p in cache.directory().iterdir())
    assert total <= 50_000 + 5000 + 2000  # the bound, and at most a tenth of it written since the last check
    assert cache.read("k39") is not None and cache.read("k0") is None  # the newest kept, the oldest gone


@pytest.mark.parametrize("value", ["lots", "0", "-5"])
def test_a_bad_bound_is_a_clear_error(cache, monkeypatch, value):
    monkeypatch.setenv("TILEFUSE_CACHE_MAX_MB", value)
    with pytest.raises(ValueError, match="TILEFUSE_CACHE_MAX_MB"):
        cache.write("a", "text")


def test_a_read_only_folder_still_reads(cache):
    cache.write("a", "text")
    os.chmod(cache.path("a"), 0o444)
    os.chmod(cache.directory(), 0o555)
    try:
        assert cache.read("a") == "text"
        if os.geteuid() != 0:  # (root writes anyway)
            with pytest.raises(OSError):
                cache.write("b", "more")
    finally:
        os.chmod(cache.directory(), 0o755)


def test_the_func_and_graph_caches_are_disk_caches():
    from tilefuse import graph_cache
    from tilefuse.lowering import func_cache

    assert (func_cache.CACHE.name, func_cache.CACHE.folder) == ("FUNC_CACHE", "funcs")
    assert (graph_cache.CACHE.name, graph_cache.CACHE.folder) == ("GRAPH_CACHE", "graphs")
    assert len(func_cache.source_digest()) == len(graph_cache.source_digest()) == 64
    assert func_cache.source_digest() != graph_cache.source_digest()
