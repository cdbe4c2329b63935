"""helpers.cluster.rundir: the one owner of a run's record (layout, schema, checkpoints, time)."""

import ast
import json

import nbformat
import numpy as np
import pandas as pd
import pytest

from helpers.cluster.protocol import RunConfig, validate
from helpers.cluster.rundir import (
    SCHEMA,
    Checkpoint,
    EventLog,
    RecordError,
    RunDir,
    first_start,
    last_attempt_window,
    ps_tasks,
    read_cluster,
    time_zero,
    write_cluster,
)
from helpers.config import REPO_ROOT


def test_a_configuration_round_trips_with_its_schema_version(tmp_path):
    cfg = validate(RunConfig(workers=2, mode="ssp", staleness=2, run_id="r1"))
    path = RunDir(tmp_path / "r1").write_config(cfg)
    assert json.loads(path.read_text())["schema"] == SCHEMA
    again, record = RunDir.read_config(path)
    assert again.to_dict() == cfg.to_dict() and record.path == tmp_path / "r1"


def test_a_run_file_written_by_hand_needs_no_version_and_may_name_its_folder(tmp_path):
    body = {"workers": 2, "mode": "sync", "run_dir": str(tmp_path / "logs")}
    (tmp_path / "run.json").write_text(json.dumps(body))
    cfg, record = RunDir.read_config(tmp_path / "run.json")
    assert cfg.mode == "sync" and record.path == tmp_path / "logs"


def test_a_record_of_a_newer_schema_is_refused_naming_both_versions(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"schema": SCHEMA + 1, "workers": 1}))
    with pytest.raises(RecordError, match=f"schema {SCHEMA + 1}.*reads schema 1 to {SCHEMA}"):
        RunDir.read_config(tmp_path / "config.json")
    (tmp_path / "cluster.json").write_text(json.dumps({"schema": "2", "ps": ["h:1"]}))
    with pytest.raises(RecordError, match="cluster file .* schema '2'"):
        read_cluster(tmp_path / "cluster.json")


def test_the_cluster_file_round_trips_and_a_hand_written_one_is_read(tmp_path):
    jobs = {"ps": ["10.0.0.1:2222", "10.0.0.2:2222"], "worker": ["10.0.0.3:2222"]}
    assert read_cluster(write_cluster(tmp_path / "cluster.json", jobs)) == jobs
    (tmp_path / "hand.json").write_text(json.dumps({"ps": ["localhost:2222"]}))
    assert read_cluster(tmp_path / "hand.json") == {"ps": ["localhost:2222"]}
    (tmp_path / "empty.json").write_text(json.dumps({"worker": ["a:1"]}))
    with pytest.raises(RecordError, match="lists no PS address"):
        read_cluster(tmp_path / "empty.json")
    with pytest.raises(ValueError, match="at least one PS address"):
        write_cluster(tmp_path / "no.json", {"ps": []})
    assert not (tmp_path / "no.json").exists()


def test_checkpoints_save_list_load_and_name_what_is_missing(tmp_path):
    record = RunDir(tmp_path)
    assert record.latest_checkpoint() is None and record.checkpoints() == []
    w = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)]
    for version in (10, 20):
        ckpt = record.save_checkpoint(version, [a * version for a in w])
    assert ckpt == Checkpoint(20, "ckpt-0000020.npz") == Checkpoint.of(20)
    assert record.latest_checkpoint() == ckpt
    assert [c.version for c in record.checkpoints()] == [10, 20]
    for which in (10, "ckpt-0000010.npz", Checkpoint.of(10)):
        got = record.load_checkpoint(which)
        assert all(np.array_equal(a, b * 10) for a, b in zip(got, w, strict=True))
    with pytest.raises(RecordError, match=r"no checkpoint ckpt-0000030.npz .*\[10, 20\]"):
        record.load_checkpoint(30)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "ckpt-0000010.npz",
        "ckpt-0000020.npz",
        "latest.json",
    ]  # nothing half-written left beside them


def _events(tmp_path):
    """Two attempts of one run (the second resumed), as the PS and a worker log them."""
    ps, worker = EventLog(tmp_path, "ps-0"), EventLog(tmp_path, "worker-1")
    lines = {
        "ps-0": [
            (100.0, "start", {"ps": 2}),
            (103.0, "joined", {}),
            (104.0, "update", {}),
            (200.0, "start", {"ps": 1}),
            (202.0, "joined", {}),
            (205.0, "update", {}),
        ],
        "worker-1": [(103.5, "step", {}), (204.0, "step", {})],
    }
    for name, log in (("ps-0", ps), ("worker-1", worker)):
        with open(log.path, "w") as f:
            for t, kind, fields in lines[name]:
                f.write(json.dumps({"t": t, "kind": kind, **fields}) + "\n")
        log.close()
    return RunDir(tmp_path)


def test_one_time_zero_and_the_latest_attempts_window(tmp_path):
    ev = _events(tmp_path).events()
    assert time_zero(ev) == 103.0  # every worker first joined
    assert first_start(ev) == 100.0
    assert last_attempt_window(ev) == (202.0, 205.0)  # the attempt just made
    assert ps_tasks(ev) == 1  # the latest start says how many PS tasks held the parameters
    assert time_zero(ev[ev.kind != "joined"]) == 100.0
    with pytest.raises(RecordError, match="no 'start' event"):
        ps_tasks(ev[ev.kind != "start"])
    with pytest.raises(RecordError, match="never trained"):
        last_attempt_window(ev[ev.kind != "update"])


def test_clock_offsets_put_every_process_on_the_drivers_clock(tmp_path):
    record = _events(tmp_path)
    tail = record.tail()
    assert record.clock_offsets() == {}
    record.write_clock_offsets({"worker-1": 0.25})  # its clock runs a quarter second ahead
    ev = record.events()
    assert ev[ev.source == "worker-1"].t.tolist() == [103.25, 203.75]
    assert ev[ev.source == "ps-0"].t.iloc[0] == 100.0
    live = pd.DataFrame(tail.read())
    assert live[live.source == "worker-1"].t.tolist() == [103.25, 203.75]


# -------------------------------------------------------------- nobody else parses the record
OWNER = "helpers/cluster/rundir.py"
RECORD_NAMES = ("ckpt-", "latest.json", ".jsonl", "config.json", "clocks.json")


def _sources():
    for tree in ("helpers", "tools", "bench"):
        for path in sorted((REPO_ROOT / tree).rglob("*.py")):
            yield str(path.relative_to(REPO_ROOT)), path.read_text()
    for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                source = "\n".join(
                    line for line in cell.source.splitlines() if not line.startswith(("%", "!"))
                )
                yield f"{path.relative_to(REPO_ROOT)} cell {i}", source


def record_parsing(name: str, source: str) -> list[str]:
    """Places in `source` that parse the run's record themselves: a record file named, the
    checkpoint folder joined, or JOINED/START events filtered to find a time."""
    found, tree = [], ast.parse(source)
    docstrings = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    parent = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            hit = [n for n in RECORD_NAMES if n in node.value]
            if hit and not node.value.startswith(("run ", "<")):
                found.append(f"{name}:{node.lineno} names {hit[0]!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if isinstance(node.right, ast.Constant) and node.right.value == "ckpt":
                found.append(f"{name}:{node.lineno} joins the checkpoint folder")
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Compare):
            text = ast.unparse(node.slice)
            up = parent.get(id(node))
            timed = (isinstance(node.value, ast.Attribute) and node.value.attr == "t") or (
                isinstance(up, ast.Attribute) and up.attr == "t"
            )  # ev.t[ev.kind == ...] or ev[ev.kind == ...].t
            joined = any(k in text for k in ("Kind.JOINED", "'joined'"))  # said for its time only
            if joined or (timed and any(k in text for k in ("Kind.START", "'start'"))):
                found.append(f"{name}:{node.lineno} finds a time in the events: {text}")
    return found


# the cluster file and a node's run file are named where they are chosen (launcher, README
# examples), then handed to rundir to write and read
ALLOWED = {"helpers/cluster/launcher.py": ("cluster.json",)}


def test_outside_rundir_nothing_parses_the_record_or_finds_time_zero():
    found = []
    for name, source in _sources():
        if name == OWNER:
            continue
        allowed = ALLOWED.get(name, ())
        found += [f for f in record_parsing(name, source) if not any(a in f for a in allowed)]
    assert not found, "read or write these through helpers.cluster.rundir:\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_parsing():
    source = (
        "p = run_dir / 'ckpt' / 'latest.json'\n"
        "t0 = ev.t[ev.kind == Kind.JOINED].min()\n"
        "s = ev[ev.kind == 'start'].t.iloc[0]\n"
        "mode = ev[ev.kind == 'start']['mode']\n"  # not a time: allowed
        "j = ev[ev.kind == Kind.JOINED]\n"
        '"""a docstring may name ckpt-0000010.npz"""\n'
    )
    found = sorted(f.split(" ", 1)[1] for f in record_parsing("x.py", source))
    assert found == [
        "finds a time in the events: ev.kind == 'start'",
        "finds a time in the events: ev.kind == Kind.JOINED",
        "finds a time in the events: ev.kind == Kind.JOINED",
        "joins the checkpoint folder",
        "names 'latest.json'",
    ]
