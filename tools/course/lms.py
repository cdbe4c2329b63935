"""Grades out to the course's LMS: the CSV files Canvas's and Moodle's gradebook imports read,
made from the gradebook through a roster that maps nbgrader ids to the LMS's own.

The roster is a CSV file with a header: an `nbgrader_id` column (the student's folder name in
the submissions, as the gradebook knows them) and the LMS's identity columns, copied as they
are. For Canvas, its gradebook export's own columns (Student, ID, SIS User ID, SIS Login ID,
Section: at least one of ID, SIS User ID and SIS Login ID, by which Canvas finds the student);
for Moodle, one of its identifiers (Email address, Username or ID number: the import page maps
it to the user). An optional columns file (`notebook,column`) gives each notebook's column
header: Canvas reads "Name (id)" as its assignment `id`, and a header without an id as a new
assignment; Moodle maps each column to a grade item on its import page. By default the header
is the notebook's name.

One column per notebook handed in by anyone holds the student's points for it, the sum of its
exercises as grades.csv gives them; a notebook the student did not hand in is a blank cell,
which both imports leave as it was (an excused mark, a lab not yet due). Canvas's file has
its export's second row, "Points Possible". Every student of the gradebook must be in the
roster, with an id the LMS finds them by: one that is not is an error naming it, and nothing
is written. Roster students the gradebook does not know (never graded) are left out, so their
LMS cells stay as they are; the log names them. This is ours: nbgrader's export writes its
own CSV only, and neither LMS's import format has a Python library.
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path

from helpers.files import atomic_path

FORMATS = ("canvas", "moodle", "csv")
KEY = "nbgrader_id"
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
CANVAS_KEYS = ("ID", "SIS User ID", "SIS Login ID")  # what Canvas finds a student by
MOODLE_KEYS = ("Email address", "Username", "ID number")
MOODLE_COLUMNS = ["First name", "Last name", "ID number", "Username", "Email address"]  # its order
POINTS_POSSIBLE = "    Points Possible"
ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")  # Canvas's export writes it so, indented


def _table(path: Path, what: str) -> tuple[list[str], list[dict]]:
    """A CSV file's header and rows; a missing or empty file is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"the {what} {path} does not exist: give the path of a CSV file")
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: Excel's byte-order mark
        reader = csv.DictReader(f)
        rows = list(reader)
        header = [h.strip() for h in reader.fieldnames or []]
    if not header:
        raise ValueError(f"the {what} {path} is empty: it needs a header row")
    rows = [{k.strip(): (v or "").strip() for k, v in r.items() if k} for r in rows]
    return header, rows


def read_roster(path: Path, fmt: str) -> tuple[list[str], dict[str, dict]]:
    """The roster's columns and nbgrader id -> its row; errors name the file and what to fix."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    header, rows = _table(path, "roster")
    if KEY not in header:
        raise ValueError(
            f"the roster {path} has no {KEY!r} column (its columns: {', '.join(header)}): "
            f"add one holding each student's nbgrader id"
        )
    needed = {"canvas": CANVAS_KEYS, "moodle": MOODLE_KEYS}.get(fmt, ())
    if needed and not set(needed) & set(header):
        raise ValueError(
            f"the roster {path} has none of the columns {fmt} finds a student by "
            f"({', '.join(needed)}); its columns: {', '.join(header)}"
        )
    students: dict[str, dict] = {}
    for line, row in enumerate(rows, start=2):
        sid = row.get(KEY, "")
        if not sid:
            raise ValueError(f"the roster {path}, line {line}: no {KEY}")
        if not ID.match(sid):  # it names a folder: collect writes into <into>/<nbgrader_id>/
            raise ValueError(
                f"the roster {path}, line {line}: {KEY} {sid!r} is not a folder name "
                f"(letters, digits, '.', '_' and '-', not starting with '.')"
            )
        if sid in students:
            raise ValueError(f"the roster {path}, line {line}: {KEY} {sid!r} appears twice")
        students[sid] = row
    return header, students


def read_columns(path: Path | None, notebooks: list[str]) -> dict[str, str]:
    """notebook -> its column's header: the columns file's `column`, else the notebook's name."""
    headers = {nb: nb for nb in notebooks}
    if path is None:
        return headers
    header, rows = _table(path, "columns file")
    if not {"notebook", "column"} <= set(header):
        raise ValueError(
            f"the columns file {path} needs the columns 'notebook' and 'column' "
            f"(it has: {', '.join(header)})"
        )
    for row in rows:
        if row["notebook"] not in headers:
            raise ValueError(
                f"the columns file {path} names the notebook {row['notebook']!r}, which the "
                f"gradebook does not have ({', '.join(notebooks)})"
            )
        headers[row["notebook"]] = row["column"] or row["notebook"]
    return headers


def totals(rows: list[dict]) -> tuple[dict, dict]:
    """From grades.csv's rows: (student, notebook) -> points, and notebook -> its maximum."""
    points: dict = defaultdict(float)
    maximum: dict = defaultdict(float)
    seen: set = set()
    for r in rows:
        points[r["student"], r["notebook"]] += float(r["points"])
        if (r["notebook"], r["exercise"]) not in seen:
            seen.add((r["notebook"], r["exercise"]))
            maximum[r["notebook"]] += float(r["max_points"])
    return dict(points), dict(maximum)


def _number(x: float) -> str:
    return f"{x:g}"


def lms_table(
    fmt: str, rows: list[dict], roster: tuple, headers: dict, submitted: set | None = None
) -> list[list[str]]:
    """The file's rows (header first) in `fmt`, from grades.csv's rows and the roster. With
    `submitted` ((student, notebook) pairs handed in), a notebook nobody handed in has no
    column, and a student's cell for a notebook they did not hand in is blank: the LMS keeps
    what it has there (an excused mark, a grade entered by hand, a lab not yet due)."""
    columns, students = roster
    points, maximum = totals(rows)
    graded = sorted({r["student"] for r in rows})
    missing = [s for s in graded if s not in students]
    if missing:
        raise ValueError(
            f"{len(missing)} graded student(s) missing from the roster: {', '.join(missing)}; "
            f"add a row for each ({KEY} and the LMS's id), nothing was written"
        )
    keys = {"canvas": CANVAS_KEYS, "moodle": MOODLE_KEYS}.get(fmt, ())
    blank = [s for s in graded if keys and not any(students[s].get(k) for k in keys)]
    if blank:
        raise ValueError(
            f"the roster gives no {' or '.join(keys)} for {', '.join(blank)}: {fmt} could not "
            f"find them; nothing was written"
        )
    notebooks = [nb for nb in headers if submitted is None or any(n == nb for _, n in submitted)]
    if fmt == "canvas":
        identity = CANVAS_COLUMNS
    elif fmt == "moodle":
        identity = [c for c in MOODLE_COLUMNS if c in columns]
    else:
        identity = [KEY] + [c for c in columns if c != KEY]
    table = [identity + [headers[nb] for nb in notebooks]]
    if fmt == "canvas":
        table.append([POINTS_POSSIBLE] + [""] * 4 + [_number(maximum[nb]) for nb in notebooks])
    for sid in graded:
        cells = [
            _number(points.get((sid, nb), 0.0))
            if submitted is None or (sid, nb) in submitted
            else ""
            for nb in notebooks
        ]
        table.append([students[sid].get(c, "") for c in identity] + cells)
    return table


def write_lms_csv(dest: Path, table: list[list[str]]) -> None:
    """The table as CSV at dest, all or nothing."""
    with atomic_path(Path(dest)) as tmp, open(tmp, "w", newline="", encoding="utf-8") as out:
        csv.writer(out).writerows(table)


def export_lms(fmt, rows, roster_path, dest, columns_path=None, say=print, submitted=None) -> Path:
    """Write `fmt`'s import file at dest from grades.csv's rows (and the pairs handed in, if
    known: see lms_table); say who was left out."""
    roster = read_roster(Path(roster_path), fmt)
    notebooks = sorted({r["notebook"] for r in rows})
    table = lms_table(fmt, rows, roster, read_columns(columns_path, notebooks), submitted)
    write_lms_csv(dest, table)
    ungraded = sorted(set(roster[1]) - {r["student"] for r in rows})
    count = len(table) - (2 if fmt == "canvas" else 1)
    say(f"{fmt}: {count} student(s), {len(notebooks)} notebook(s) in {dest}")
    if ungraded:
        say(f"not in the gradebook, left out (their LMS cells stay): {', '.join(ungraded)}")
    return Path(dest)
