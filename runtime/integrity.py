"""An artifact's layout and integrity: member names, the manifest's hash table, the integrity root, and a
check that the kernels TileLang loaded are the artifact's own (not rebuilt behind its back).

Note: the integrity root. ``manifest.json`` lists the sha256 and size of every other member; the member
``integrity.json`` holds one sha256 over the name and sha256 of every member, manifest.json included
(``root_hash``). Loading checks each member against the manifest (so an error names the member) and then
the root, so an edit of any byte of the manifest (a version string, the input signature, a hash) is refused
as well. Like the member hashes, the root detects corruption and edits, not a hostile author, who can
recompute it: see the trust note in ``runtime/artifact.py``.

Note: what compiled. TileLang checks a cache entry against the entry's own manifest and, when it fails (or
its library does not load), deletes the entry and compiles the kernel again under the same cache key,
logging only a warning. So a cache key proves nothing; ``entry_stamps`` records each unpacked entry's files
(inode, mtime, size) before the kernels are loaded and ``rebuilt_entries`` names the entries that changed
since: each is a kernel that was compiled, not loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

FORMAT, FORMAT_VERSION = "tilefuse-artifact", 2  # 2: the integrity root (integrity.json)
MANIFEST, ROOT = "manifest.json", "integrity.json"
GRAPH, PLAN, TUNING, WEIGHTS = "graph.json", "plan.json", "tuning.json", "weights.safetensors"
REQUIRED = (GRAPH, PLAN, TUNING, WEIGHTS)
# The files of a TileLang cache entry for the default execution backends (cython for c, tvm_ffi for cuda).
# Backends that cache Python (nvrtc/cutedsl ``kernel.py``) are left out: loading runs no Python from an artifact.
LIBS = ("kernel_lib.so", "executable.so")
KERNEL_FILES = (*LIBS, "params.json", "manifest.json", "device_kernel.cu", "host_kernel.cu", "resource_usage.json")
KERNEL_MEMBER = re.compile(r"kernels/([0-9a-f]{64})/(" + "|".join(map(re.escape, KERNEL_FILES)) + ")")
# Each kernel's PrimFunc as TVM JSON (IR data, no code): loading it takes milliseconds where rebuilding it
# from the template takes ~0.15 s a kernel, and it hashes to the same cache key.
FUNC_MEMBER = re.compile(r"funcs/([0-9a-f]{64})\.json")
SHA = re.compile(r"[0-9a-f]{64}")
# A kernel built for a vendor's toolchain (``tilefuse compile --target hip|metal|ascend``): its source and, for hip,
# its code object; data for the vendor's runtime, never loaded by tilefuse.
VENDOR_MEMBER = re.compile(r"vendor/([0-9a-f]{64})\.(hip|hsaco|metal|cpp)")
_ROOT_TAG = b"tilefuse-artifact-root-1\n"


class ArtifactError(ValueError):
    """An artifact that cannot be trusted or read: corrupted, tampered, truncated, unsafe or malformed."""


def root_hash(members: dict[str, bytes]) -> str:
    """The integrity root over ``members`` (manifest.json and every other member but the root itself)."""
    h = hashlib.sha256(_ROOT_TAG)
    for name in sorted(members):
        h.update(f"{name}\0{hashlib.sha256(members[name]).hexdigest()}\n".encode())
    return h.hexdigest()


def root_bytes(members: dict[str, bytes]) -> bytes:
    """The ``integrity.json`` member for ``members``."""
    return json.dumps({"sha256": root_hash(members)}, indent=1).encode()


def json_member(path: Path, name: str, blob: bytes) -> Any:
    """Member ``name`` parsed as strict JSON (no NaN/Infinity), or ``ArtifactError`` naming it."""
    def refuse(c):
        raise ValueError(f"{c} is not JSON")

    try:
        return json.loads(blob.decode("utf-8"), parse_constant=refuse)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ArtifactError(f"{path}: member {name} is not valid JSON ({e})") from None


def _check_name(path: Path, name: str) -> None:
    if name in (MANIFEST, ROOT, *REQUIRED) or KERNEL_MEMBER.fullmatch(name) or FUNC_MEMBER.fullmatch(name) \
            or VENDOR_MEMBER.fullmatch(name):
        return
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or re.match(r"[A-Za-z]:", name):
        raise ArtifactError(f"{path}: member {name!r} has an unsafe path (absolute or with '..'); refused")
    raise ArtifactError(f"{path}: unexpected member {name!r}")


def _check_manifest(m: Any) -> dict:
    """The manifest's member table, after checking the manifest's shape (``ValueError`` otherwise)."""
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError("not a tilefuse artifact manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"format version {m.get('format_version')!r}; this tilefuse reads version "
                         f"{FORMAT_VERSION} (save the model again with this tilefuse)")
    for k in ("tilefuse", "tilelang", "torch"):
        if not isinstance(m[k], str):
            raise TypeError(f"{k} version is not a string")
    if not (isinstance(m["target"], dict) and isinstance(m["target"].get("kind"), str)):
        raise TypeError(f"bad target {m['target']!r}")
    if not (isinstance(m["host"], dict) and isinstance(m["options"], dict)):
        raise TypeError("bad host or options")
    if not all(isinstance(k, str) and SHA.fullmatch(k) for k in m["kernels"]):
        raise ValueError("bad kernel keys")
    members = m["members"]
    for name, meta in members.items():
        if not (isinstance(meta, dict) and isinstance(meta.get("sha256"), str) and SHA.fullmatch(meta["sha256"])
                and isinstance(meta.get("size"), int) and meta["size"] >= 0):
            raise ValueError(f"bad entry for member {name!r}")
    return members


def _read_member(zf: zipfile.ZipFile, path: Path, name: str) -> bytes:
    try:
        return zf.read(name)
    except Exception as e:  # noqa: BLE001 - BadZipFile (CRC), zlib.error, EOFError: all mean a damaged member
        raise ArtifactError(f"{path}: member {name} is corrupted ({type(e).__name__}: {e})") from None


def read_artifact(path: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    """The manifest and every other member's bytes, each checked against the manifest's size and sha256,
    and all of them, manifest included, against the integrity root.

    Raises ``ArtifactError`` naming the member for a truncated archive, an unsafe or unexpected member
    name, a missing or unlisted member, a bad manifest or format version, a hash mismatch, or a manifest
    changed after saving.
    """
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError) as e:
        raise ArtifactError(f"{path}: not a tilefuse artifact: the zip archive is truncated or damaged ({e})") from None
    with zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        for n in names:
            _check_name(path, n)
        if len(set(names)) != len(names):
            raise ArtifactError(f"{path}: member {next(n for n in names if names.count(n) > 1)!r} appears twice")
        if MANIFEST not in names:
            raise ArtifactError(f"{path}: member {MANIFEST} is missing")
        manifest_blob = _read_member(zf, path, MANIFEST)
        manifest = json_member(path, MANIFEST, manifest_blob)
        try:
            listed = _check_manifest(manifest)
        except Exception as e:  # noqa: BLE001 - anything a malformed manifest makes the checks raise
            raise ArtifactError(f"{path}: member {MANIFEST} is malformed ({type(e).__name__}: {e})") from None
        for n in (ROOT, *REQUIRED, *listed, *(f"kernels/{k}/params.json" for k in manifest["kernels"])):
            if n not in names:
                raise ArtifactError(f"{path}: member {n} is missing")
        for k in manifest["kernels"]:
            if not any(f"kernels/{k}/{lib}" in names for lib in LIBS):
                raise ArtifactError(f"{path}: member kernels/{k}/{' or '.join(LIBS)} is missing")
        data = {}
        for info in infos:
            n = info.filename
            if n in (MANIFEST, ROOT):
                continue
            if n not in listed:
                raise ArtifactError(f"{path}: member {n} is not listed in {MANIFEST}")
            if info.file_size != listed[n]["size"]:
                raise ArtifactError(f"{path}: member {n} has {info.file_size} bytes, {MANIFEST} says {listed[n]['size']}")
            blob = _read_member(zf, path, n)
            if hashlib.sha256(blob).hexdigest() != listed[n]["sha256"]:
                raise ArtifactError(f"{path}: member {n} fails its sha256 check (corrupted or tampered)")
            data[n] = blob
        root = json_member(path, ROOT, _read_member(zf, path, ROOT))
    if not (isinstance(root, dict) and root.get("sha256") == root_hash({MANIFEST: manifest_blob, **data})):
        raise ArtifactError(f"{path}: member {MANIFEST} fails the artifact's integrity check (the sha256 root in "
                            f"{ROOT} does not match it): the manifest was changed after saving, or {ROOT} was")
    return manifest, data


# ---- what compiled --------------------------------------------------------------------------------

def entry_stamps(root: Path, keys) -> dict[str, dict[str, tuple[int, int, int]]]:
    """Per kernel key, each file of its unpacked cache entry under ``root``: (inode, mtime_ns, size)."""
    stamps = {}
    for key in keys:
        entry = root / key
        stamps[key] = {f.name: (s.st_ino, s.st_mtime_ns, s.st_size)
                       for f in entry.iterdir() for s in [f.stat()]} if entry.is_dir() else {}
    return stamps


def rebuilt_entries(root: Path, stamps: dict[str, dict[str, tuple[int, int, int]]]) -> set[str]:
    """The keys whose cache entry under ``root`` no longer holds the files ``entry_stamps`` recorded."""
    now = entry_stamps(root, stamps)
    return {key for key, files in stamps.items() if any(now[key].get(n) != st for n, st in files.items())}
