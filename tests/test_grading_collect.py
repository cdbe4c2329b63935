"""Submissions in (tools/course/collect.py): zips in Canvas's and Moodle's download naming, made
here, unpacked into one folder per student through the roster; every hostile member (a path
out of the zip, an absolute path, a link, a bomb, too many entries) refused, and a refused zip
leaves nothing behind. That a collected zip is then graded is in test_course.py."""

from __future__ import annotations

import csv
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from tools.course import collect as collect_module
from tools.course.collect import collect

ROSTER = [
    {"nbgrader_id": "ada", "ID": "1201", "First name": "Ada", "Last name": "Lovelace"},
    {"nbgrader_id": "bob", "ID": "1202", "First name": "Charles", "Last name": "Babbage"},
    {"nbgrader_id": "kim1", "ID": "1203", "First name": "Kim", "Last name": "Lee"},
    {"nbgrader_id": "kim2", "ID": "1204", "First name": "Kim", "Last name": "Lee"},
]


def notebook(tag: str) -> str:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"answer = {tag!r}")])
    return nbformat.writes(nb)


@pytest.fixture
def roster(tmp_path) -> Path:
    path = tmp_path / "roster.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(ROSTER[0]))
        writer.writeheader()
        writer.writerows(ROSTER)
    return path


def make_zip(path: Path, members: dict[str, str | bytes], links=()) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, target in links:  # a symbolic link, as `zip --symlinks` stores one
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return path


def test_a_canvas_download_lands_in_one_folder_per_student(tmp_path, roster):
    zipped = make_zip(
        tmp_path / "submissions.zip",
        {
            "lovelaceada_1201_5551_02_logreg_lr_schedules.ipynb": notebook("ada, latest"),
            "lovelaceada_1201_5550_02_logreg_lr_schedules.ipynb": notebook("ada, earlier"),
            "babbagecharles_LATE_1202_5552_my lab 3?.ipynb": notebook("bob"),
            "strangerx_9999_5553_02_logreg.ipynb": notebook("who?"),
            "lovelaceada_1201_5554_notes.pdf": b"%PDF-1.4",
            "../../evil_1201_5555_x.ipynb": notebook("escape"),
            "/abs_1201_5556_x.ipynb": notebook("absolute"),
            "__MACOSX/._lovelaceada_1201_5551_x.ipynb": b"\x00\x05",
        },
        links=[("lovelaceada_1201_5557_link.ipynb", "/etc/passwd")],
    )
    said: list[str] = []
    into = tmp_path / "subs"
    got = collect(zipped, roster, into, say=said.append)
    assert got.files == {"ada": ["02_logreg_lr_schedules.ipynb"], "bob": ["my lab 3_.ipynb"]}
    assert "ada, latest" in (into / "ada" / "02_logreg_lr_schedules.ipynb").read_text()
    assert sorted(p.name for p in into.iterdir()) == ["ada", "bob"]
    assert got.late == ["bob"] and got.unmapped == ["strangerx (9999)"]
    skipped = "\n".join(got.skipped)
    for member, why in [
        ("lovelaceada_1201_5550_02_logreg_lr_schedules.ipynb", "an older upload"),
        ("lovelaceada_1201_5554_notes.pdf", "not a notebook"),
        ("../../evil_1201_5555_x.ipynb", "outside the zip, refused"),
        ("/abs_1201_5556_x.ipynb", "outside the zip, refused"),
        ("lovelaceada_1201_5557_link.ipynb", "a link, refused"),
        ("__MACOSX/._lovelaceada_1201_5551_x.ipynb", "not in Canvas's or Moodle's naming"),
    ]:
        assert f"{member}: {why}" in skipped, (member, skipped)
    assert not (tmp_path / "evil_1201_5555_x.ipynb").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging
    assert "strangerx (9999)" in "\n".join(said) and "late by the LMS: bob" in "\n".join(said)


def test_a_moodle_download_is_matched_by_full_name_never_guessed(tmp_path, roster):
    zipped = make_zip(
        tmp_path / "moodle.zip",
        {
            "Ada Lovelace_4411_assignsubmission_file_/02_logreg_lr_schedules.ipynb": notebook("a"),
            "Charles Babbage_4412_assignsubmission_file_03_opt.ipynb": notebook("b"),
            "Nobody Here_4413_assignsubmission_file_/x.ipynb": notebook("c"),
            "Kim Lee_4414_assignsubmission_file_/x.ipynb": notebook("d"),
        },
    )
    got = collect(zipped, roster, tmp_path / "subs", say=lambda _: None)
    assert got.files == {"ada": ["02_logreg_lr_schedules.ipynb"], "bob": ["03_opt.ipynb"]}
    assert got.unmapped == ["Nobody Here (4413)", "Kim Lee (4414) matches several students"]


@pytest.mark.parametrize(
    "bound, value, members, match",
    [
        ("MAX_FILE_BYTES", 2**20, {"lovelaceada_1201_1_a.ipynb": b"\0" * (3 * 2**20)}, "past 1 MB"),
        (
            "MAX_TOTAL_BYTES",
            2**20,
            {f"lovelaceada_1201_{i}_{i}.ipynb": b"\0" * 600_000 for i in range(2)},
            "the zip inflates past",
        ),
        (
            "MAX_MEMBERS",
            3,
            {f"lovelaceada_1201_{i}_{i}.ipynb": b"{}" for i in range(4)},
            "4 entries",
        ),
    ],
)
def test_a_bomb_or_a_flood_is_refused_and_leaves_nothing(
    tmp_path, roster, monkeypatch, bound, value, members, match
):
    monkeypatch.setattr(collect_module, bound, value)
    zipped = make_zip(tmp_path / "bomb.zip", members)
    assert zipped.stat().st_size < 100_000  # deflated zeros: small on disk
    with pytest.raises(ValueError, match=match):
        collect(zipped, roster, tmp_path / "subs", say=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.zip", "roster.csv"]


def test_make_collect_names_a_file_that_is_not_a_zip(tmp_path, roster):
    bad = tmp_path / "grades.csv"
    bad.write_text("not a zip")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.course",
            "collect",
            str(bad),
            "--roster",
            str(roster),
            "--into",
            str(tmp_path / "subs"),
        ],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and f"{bad} is not a zip file" in done.stderr, done.stderr
    assert not (tmp_path / "subs").exists()


def test_canvas_names_with_underscores_and_a_file_uploaded_again(tmp_path, roster):
    zipped = make_zip(
        tmp_path / "again.zip",
        {
            "lovelace_ada_1201_7001_03_opt.ipynb": notebook("first upload"),
            "lovelace_ada_1201_7002_03_opt-1.ipynb": notebook("uploaded again"),
        },
    )
    got = collect(zipped, roster, tmp_path / "subs", say=lambda _: None)
    assert got.files == {"ada": ["03_opt.ipynb"]}, got
    assert "uploaded again" in (tmp_path / "subs" / "ada" / "03_opt.ipynb").read_text()


def test_a_corrupt_member_is_named_and_nothing_is_collected(tmp_path, roster):
    zipped = tmp_path / "bad.zip"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_STORED) as zf:  # stored: its bytes as they are
        zf.writestr("lovelaceada_1201_1_a.ipynb", notebook("x" * 5000))
    data = bytearray(zipped.read_bytes())
    start = data.index(b"lovelaceada_1201_1_a.ipynb") + 40  # inside the first member's data
    data[start : start + 200] = bytes(200)
    zipped.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="lovelaceada_1201_1_a.ipynb cannot be read"):
        collect(zipped, roster, tmp_path / "subs", say=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.zip", "roster.csv"]


def test_a_roster_id_that_is_not_a_folder_name_is_refused(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text("nbgrader_id,ID\n../eve,1205\n")
    zipped = make_zip(tmp_path / "s.zip", {"eve_1205_1_a.ipynb": notebook("e")})
    with pytest.raises(ValueError, match="'../eve' is not a folder name"):
        collect(zipped, path, tmp_path / "subs", say=lambda _: None)
