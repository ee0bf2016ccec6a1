"""Checks of the files a command will write, made before it starts any work: a run that ends in a traceback
after minutes of load (its results lost) because its output path cannot be written is a usage error found late.

A module of its own with no dependencies, so the bench scripts (``python -m bench.suite``) and the CLI share the
wording without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path


def output_file_problem(path: Path, example: str = "out.json") -> str | None:
    """Why ``path`` cannot be written as a file, in a few words for ``OPTION PATH: <reason>``, or None if it can:
    not a folder, its folder exists, is a folder and is writable, and an existing file there is writable. Nothing
    is made (a missing folder is not created: a typo would leave a tree behind). ``example``: the file name the
    reason suggests when ``path`` is a folder."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        return f"is a folder; give a file name (e.g. {path / example})"
    if not folder.is_dir():
        return f"its folder {folder} does not exist" if not folder.exists() else f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {folder} is not writable"
    if path.exists() and not os.access(path, os.W_OK):
        return "the file exists and is not writable"
    return None


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot serve as a folder to write in, in a few words for ``OPTION PATH: <reason>``, or None if
    it can: an existing writable folder, or one made here (its parents too, as the run would make it)."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            return "exists and is not a folder; give a folder (made if missing)"
        if not os.access(path, os.W_OK | os.X_OK):
            return "the folder is not writable"
        return None
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        return f"cannot make the folder: {exc.strerror or exc}"
    return None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (mode 0600, also when the file was there
    before with another mode): a config that may hold credentials (a NATS token or password, TLS key paths) in a run
    dir that other local users can read (``--run-dir`` made with the umask's 0755)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text)
