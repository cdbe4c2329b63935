"""Submissions in: an LMS's submission download (one zip) into one folder per student, the
layout `make grade` reads (SUBMISSIONS/<nbgrader id>/<notebook>.ipynb).

- Canvas's "Download Submissions" names each file `<name>[_LATE]_<user id>_<attachment id>_
  <file name>`, the user id being Canvas's (the ID column of its gradebook and of the roster),
  the attachment id growing with each upload; a file uploaded again under the same name gets
  `-1`, `-2` before its extension, which is taken off, so the newest upload wins.
- Moodle's "Download all submissions" names each file, or the folder holding it,
  `<full name>_<participant id>_assignsubmission_file_[<file name>]`; the participant id is
  the assignment's own, not in any gradebook, so a student is found by full name (the roster's
  First name and Last name).

The roster is the one `make grade-export` reads (tools/course/lms.py). A name or id it cannot
map, or maps to two students, is listed and its files left out: never guessed. Only notebooks
are collected (by the notebook's own name once the LMS's prefix is taken off; grading then
matches them to lessons by content, as it does any renamed notebook); everything else is listed.

The zip is untrusted. Nothing is written from its paths: each file goes to
<into>/<nbgrader id>/<its base name, reduced to safe characters>, so no member can write
outside the target folder (absolute paths, `..`, links are refused and listed anyway). The number
of members, each file's size and the total are bounded, counting the bytes actually inflated,
not the sizes the zip declares. Everything is unpacked into a temporary folder first; only when
the whole zip was read does anything move into place, so a refused zip leaves nothing behind.
This is ours: neither LMS ships a library for its download format.
"""

from __future__ import annotations

import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tools.course.lms import read_roster

MAX_MEMBERS = 10_000  # entries in the zip
MAX_FILE_BYTES = 64 * 2**20  # one notebook, inflated (a lesson with outputs: a few MB)
MAX_TOTAL_BYTES = 2 * 2**30  # the whole download, inflated
CANVAS = re.compile(r"^(?P<name>[^/]+?)(?P<late>_LATE)?_(?P<user>\d+)_(?P<sub>\d+)_(?P<file>.+)$")
AGAIN = re.compile(r"-\d+(?=\.ipynb$)", re.I)  # Canvas's mark of a file uploaded again
MOODLE = re.compile(r"^(?P<name>[^/]+?)_(?P<user>\d+)_assignsubmission_[a-z]+_(?P<file>.*)$")
SAFE = re.compile(r"[^A-Za-z0-9._ -]")


@dataclass
class Collected:
    """What collecting a zip did: files per student, and everything left out, with why."""

    files: dict[str, list[str]] = field(default_factory=dict)  # nbgrader id -> file names
    late: list[str] = field(default_factory=list)  # nbgrader ids marked late by Canvas
    unmapped: list[str] = field(default_factory=list)  # "name (id)" the roster lacks
    skipped: list[str] = field(default_factory=list)  # member: why it was left out


def _member_path(info: zipfile.ZipInfo) -> PurePosixPath | None:
    """The member's path, or None if it is absolute, climbs out (..), or is a link."""
    name = info.filename.replace("\\", "/")
    if stat.S_ISLNK(info.external_attr >> 16):
        return None
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name):
        return None
    return path


def _whose(path: PurePosixPath) -> tuple[str, str, str, bool, str, int] | None:
    """(lms, name, id, late, file name, upload order) from a member's LMS naming, or None;
    Moodle's download holds one upload a file, so its order is 0."""
    m = CANVAS.match(path.name)
    if m and len(path.parts) == 1:
        return "canvas", m["name"], m["user"], bool(m["late"]), m["file"], int(m["sub"])
    for i, part in enumerate(path.parts):  # Moodle: the file, or a folder above it
        m = MOODLE.match(part)
        if m:
            rest = m["file"] if i == len(path.parts) - 1 else path.name
            return "moodle", m["name"], m["user"], False, rest, 0
    return None


def _people(roster: dict[str, dict]) -> tuple[dict, dict]:
    """Canvas user id -> nbgrader ids, and full name -> nbgrader ids, from the roster."""
    by_id: dict[str, list[str]] = {}
    by_name: dict[str, list[str]] = {}
    for sid, row in roster.items():
        if row.get("ID"):
            by_id.setdefault(row["ID"], []).append(sid)
        full = " ".join(f"{row.get('First name', '')} {row.get('Last name', '')}".split())
        if full:
            by_name.setdefault(full.casefold(), []).append(sid)
    return by_id, by_name


def _inflate(zf: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path, budget: list[int]) -> None:
    """Copy one member to dest, counting the bytes actually inflated against both bounds."""
    written = 0
    with zf.open(info) as src, open(dest, "wb") as out:
        while chunk := src.read(1 << 20):
            written += len(chunk)
            budget[0] -= len(chunk)
            if written > MAX_FILE_BYTES:
                raise ValueError(
                    f"{info.filename} inflates past {MAX_FILE_BYTES >> 20} MB: not a notebook "
                    f"a student wrote; nothing was collected"
                )
            if budget[0] < 0:
                raise ValueError(
                    f"the zip inflates past {MAX_TOTAL_BYTES >> 30} GB; nothing was collected"
                )
            out.write(chunk)


def _open(zip_path: Path) -> zipfile.ZipFile:
    """The zip, or a clear error if its directory cannot be read."""
    try:
        return zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ValueError(
            f"{zip_path} cannot be read as a zip ({exc}); nothing was collected"
        ) from None


def _choose(members, by_id: dict, by_name: dict, result: Collected) -> dict:
    """(nbgrader id, safe file name) -> the member to unpack there (the latest attempt); what
    is left out goes into `result` with why."""
    chosen: dict[tuple[str, str], tuple[int, zipfile.ZipInfo]] = {}
    for info in members:
        if info.is_dir():
            continue
        path = _member_path(info)
        if path is None:
            why = "a link" if stat.S_ISLNK(info.external_attr >> 16) else "outside the zip"
            result.skipped.append(f"{info.filename}: {why}, refused")
            continue
        who = _whose(path)
        if who is None:
            result.skipped.append(f"{info.filename}: not in Canvas's or Moodle's naming")
            continue
        lms, name, uid, late, filename, attempt = who
        if lms == "canvas":
            ids = by_id.get(uid, [])
        else:
            ids = by_name.get(" ".join(name.split()).casefold(), [])
        if len(ids) != 1:  # none, or two students of one name: listed, never guessed
            label = f"{name} ({uid})" + (" matches several students" if ids else "")
            if label not in result.unmapped:
                result.unmapped.append(label)
            continue
        if not filename.lower().endswith(".ipynb"):
            result.skipped.append(f"{info.filename}: not a notebook")
            continue
        if lms == "canvas":
            filename = AGAIN.sub("", filename)
        safe = SAFE.sub("_", PurePosixPath(filename).name).lstrip(".") or "notebook.ipynb"
        if late and ids[0] not in result.late:
            result.late.append(ids[0])
        key = (ids[0], safe)
        if key in chosen and chosen[key][0] >= attempt:
            result.skipped.append(f"{info.filename}: an older upload")
            continue
        if key in chosen:
            result.skipped.append(f"{chosen[key][1].filename}: an older upload")
        chosen[key] = (attempt, info)
    return {k: info for k, (_, info) in chosen.items()}


def collect(zip_path: Path, roster_path: Path, into: Path, say=print) -> Collected:
    """Unpack an LMS's submission zip into into/<nbgrader id>/, all or nothing; say what was
    left out and why."""
    zip_path, into = Path(zip_path), Path(into)
    if not zipfile.is_zipfile(zip_path):
        raise ValueError(f"{zip_path} is not a zip file: give the LMS's submission download")
    _, roster = read_roster(roster_path, "csv")
    by_id, by_name = _people(roster)
    result, budget = Collected(), [MAX_TOTAL_BYTES]
    into.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{into.name}.collect.", dir=into.parent))
    try:
        zf = _open(zip_path)
        with zf:
            members = zf.infolist()
            if len(members) > MAX_MEMBERS:
                raise ValueError(
                    f"{zip_path} holds {len(members)} entries, more than {MAX_MEMBERS}: "
                    f"not a class's submissions; nothing was collected"
                )
            for (sid, safe), info in sorted(_choose(members, by_id, by_name, result).items()):
                (staging / sid).mkdir(exist_ok=True)
                target = staging / sid / safe
                assert target.resolve().is_relative_to(staging.resolve()), target
                try:
                    _inflate(zf, info, target, budget)
                except (zipfile.BadZipFile, RuntimeError, NotImplementedError, EOFError) as exc:
                    raise ValueError(  # a corrupt, encrypted or oddly compressed member
                        f"{zip_path}: {info.filename} cannot be read ({exc}); nothing was collected"
                    ) from None
                result.files.setdefault(sid, []).append(safe)
        for sid, names in result.files.items():  # the whole zip was read: move into place
            (into / sid).mkdir(parents=True, exist_ok=True)
            for name in names:
                (staging / sid / name).replace(into / sid / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _say(result, into, say)
    return result


def _say(result: Collected, into: Path, say) -> None:
    count = sum(len(v) for v in result.files.values())
    say(f"collected {count} notebook(s) of {len(result.files)} student(s) into {into}/")
    if result.late:
        say(f"marked late by the LMS: {', '.join(sorted(result.late))}")
    if result.unmapped:
        say(
            f"not in the roster, left out (add them to the roster and collect again): "
            f"{', '.join(result.unmapped)}"
        )
    for line in result.skipped:
        say(f"left out: {line}")
