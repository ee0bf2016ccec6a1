"""Version pinning: a served model version is the bytes it was first loaded from (docs/models.md, "Pinned versions").

A version's files are treated as immutable once it is served, as Triton treats them: when a version is first loaded
(``inferbus up``, before any actor starts; ``inferbus models load``, at the ingress that takes the write) the
SHA-256 **digest** of its files is recorded, and every later load of that version (a worker restarted by its
supervisor, a worker applying a serving state) checks the files against it first. A version whose files changed or
disappeared is not served by that worker (it serves its other versions); it reports the reason
(``LoadReport.load_errors``, prefixed :data:`PIN_ERROR_PREFIX`), which the ingresses show in health and in the model
listing, and answer with at once (INTERNAL) when no worker serves the version any more.

The digest (``"sha256:<64 hex>"``) covers every regular file under the version folder whose name does not start with
``.`` (the model file and any ONNX external-data files beside it; hidden files such as an editor's swap file or
``.DS_Store`` are left out). For a folder holding only ``model.onnx`` (the usual case) it is the SHA-256 of that file,
what ``sha256sum model.onnx`` prints; with several files it is the SHA-256 of the manifest of
``"<sha256 hex>  <relative path>\\n"`` lines in path order (``sha256sum`` of each file, sorted by path).

Cost: files are read once per load in 1 MiB chunks (memory stays flat); SHA-256 (hashlib) ran at 1.0-1.2 GB/s on one
core of the shared 2-core box (a file in the page cache; 0.65 GB/s with tests running beside it), so a 1 GB model adds
about 1 s to ``inferbus up`` and to each worker's load of it, next to the session creation. Nothing here runs per
request.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ._repository import ModelPinError

PIN_ERROR_PREFIX = "ModelPinError: "
"""First words of a worker's ``load_errors`` entry for a version it does not serve because its files are not the
pinned ones (the ingresses pick those entries out)."""
_CHUNK_BYTES = 1 << 20
"""Read size while hashing, bytes."""


@dataclass(frozen=True)
class VersionFiles:
    """What :func:`version_files` read: the digest, and each file's ``(path, inode, size, mtime_ns)`` at the time."""

    digest: str
    stats: tuple[tuple[str, int, int, int], ...]

    def unchanged(self) -> bool:
        """Whether every file still has the inode, size and modification time it had when hashed (a few ``stat``
        calls; used after a load to see that what was loaded is what was hashed)."""
        for path, ino, size, mtime_ns in self.stats:
            try:
                st = os.stat(path)
            except OSError:
                return False
            if (st.st_ino, st.st_size, st.st_mtime_ns) != (ino, size, mtime_ns):
                return False
        return True


def _files(folder: Path) -> list[Path]:
    return sorted((p for p in folder.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(folder).parts)), key=lambda p: p.relative_to(folder).as_posix())


def version_files(folder: Path) -> VersionFiles:
    """Digest of the files of one version folder (module docstring: what is covered); blocking, reads every file
    once (about 1 s per GB): call it off the event loop.

    Raises:
        ModelPinError: the folder or its ``model.onnx`` is missing.
        OSError: a file cannot be read.
    """
    folder = Path(folder)
    if not (folder / "model.onnx").is_file():
        raise ModelPinError(f"files missing: {folder / 'model.onnx'}")
    stats = []
    lines = []
    for path in _files(folder):
        st = os.stat(path)
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK_BYTES):
                h.update(chunk)
        stats.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
        lines.append(f"{h.hexdigest()}  {path.relative_to(folder).as_posix()}\n")
    if len(lines) == 1 and lines[0].endswith("  model.onnx\n"):
        digest = lines[0].split()[0]
    else:
        digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    return VersionFiles(f"sha256:{digest}", tuple(stats))


def check_pin(model: str, version: str, folder: Path, pinned: str | None) -> VersionFiles:
    """Read the version's files and compare them with the digest ``pinned`` (None: not pinned, nothing compared).

    Returns:
        the files read (their digest, and the stats :meth:`VersionFiles.unchanged` compares later).

    Raises:
        ModelPinError: a mismatch (``digest mismatch: expected <pinned> got <now>``), or the files are missing; the
            message names the model, the version and the folder, and how to serve new files.
    """
    how = (f"restore the files, or serve the new ones: as a new version folder, or with "
           f"`inferbus models load {model} --version {version}` (re-pins)")
    try:
        files = version_files(folder)
    except ModelPinError as exc:
        if pinned is None:
            raise ModelPinError(f"model {model!r} version {version}: {exc}") from None
        raise ModelPinError(f"model {model!r} version {version}: {exc} (pinned to {pinned} when it was first "
                            f"loaded); not served: {how}") from None
    except OSError as exc:
        raise ModelPinError(f"model {model!r} version {version}: files unreadable: {exc}") from exc
    if pinned is not None and files.digest != pinned:
        raise ModelPinError(f"model {model!r} version {version}: digest mismatch: expected {pinned} got "
                            f"{files.digest} ({folder}: changed since the version was first loaded); not served: "
                            f"{how}")
    return files


def pin_repository(root: Path, only=(), configs: dict[str, dict] | None = None) -> dict[str, str]:
    """Digests of every version on disk under ``root`` (``<name>/<digits>/model.onnx``; only the models in ``only``
    when given) that its model's ``version_policy`` serves (from ``configs``, model name → config fields as
    :func:`~inferbus.actors._repository.read_configs` gives them; a model not there: every version), by
    ``"name:version"``. Blocking: reads every version's files once. A version that cannot be read is left out (not
    pinned; the repository check reports it).
    """
    from ._repository import policy_versions

    root = Path(root)
    out = {}
    for cfg in sorted(root.glob("*/config.json")):
        folder = cfg.parent
        if only and folder.name not in only:
            continue
        vdirs = [v for v in sorted(folder.iterdir())
                 if v.is_dir() and v.name.isascii() and v.name.isdigit() and (v / "model.onnx").is_file()]
        served = policy_versions((configs or {}).get(folder.name, {}).get("version_policy"), [v.name for v in vdirs])
        for vdir in vdirs:
            if served is None or vdir.name in served:
                try:
                    out[f"{folder.name}:{vdir.name}"] = version_files(vdir).digest
                except (OSError, ModelPinError):
                    continue
    return out


def pinned_versions(pins) -> dict[str, set[str]]:
    """Model name → the version names of ``pins`` (``"name:version"`` keys, as :func:`pin_repository` returns): the
    versions a restarted actor's read of the repository must find (``ModelRepository(..., need=...)``)."""
    need: dict[str, set[str]] = {}
    for key in pins:
        name, _, version = key.rpartition(":")
        need.setdefault(name, set()).add(version)
    return need
