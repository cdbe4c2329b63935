"""Files: writes that are all or nothing, and a file's sha256.

Writes: a reader (or a crash) never sees a half-written file.

What the project caches, and what one process reads while another may be writing it (sweep
records, checkpoints and their `latest.json`, notebook 01's features, notebook 08's row file),
is written to a temporary name in the same folder and renamed over the target only once
complete; `os.replace` is atomic on one file system. Files written once before the process
that reads them starts (a cluster's config, a child's job file) need none of this.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CHUNK = 1 << 20  # bytes read at a time when hashing
_UMASK = os.umask(0o022)  # read the umask (the only way), then put it back
os.umask(_UMASK)


@contextmanager
def atomic_path(path: Path, suffix: str = ".tmp", directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `path`; it replaces `path` only if the block succeeds.

    Args:
        path: the file (or folder) to write.
        suffix: the temporary name's ending (np.savez wants ".npz").
        directory: yield an empty folder instead of a file; an existing folder at `path`
            is removed just before the new one takes its place.
    On an error in the block the temporary file or folder is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    # mkstemp and mkdtemp make owner-only files: give what a plain write would
    os.chmod(tmp, (0o777 if directory else 0o666) & ~_UMASK)
    try:
        yield tmp
        if directory and path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if directory:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def write_json(path: Path, obj, indent: int | None = None, default=None) -> Path:
    """Write `obj` as JSON to `path`, all or nothing."""
    with atomic_path(path, ".json") as tmp:
        tmp.write_text(json.dumps(obj, indent=indent, default=default))
    return Path(path)


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes, as hex; read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
