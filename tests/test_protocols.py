"""The written-down protocols: event kinds of a run's logs, and parent-child control lines."""

import json

import pytest

from helpers.cluster.events import Kind
from helpers.cluster.rundir import EventLog, read_events
from helpers.system import control


def test_an_event_log_refuses_a_kind_it_does_not_know(tmp_path):
    log = EventLog(tmp_path, "ps-0")
    log.write(Kind.UPDATE, version=1)
    with pytest.raises(ValueError, match="updte"):
        log.write("updte", version=2)
    log.close()
    events = read_events(tmp_path)
    assert events.kind.tolist() == ["update"] and (events.kind == Kind.UPDATE).all()


def test_every_kind_is_written_somewhere_and_read_by_name():
    from helpers.config import REPO_ROOT

    code = "".join(p.read_text() for p in (REPO_ROOT / "helpers" / "cluster").glob("*.py"))
    unused = [k.name for k in Kind if f"Kind.{k.name}" not in code]
    assert unused == [], f"kinds no process writes or reads: {unused}"


def test_control_lines_round_trip_and_refuse_unknown_names():
    line = control.event_line(control.Event.DONE, result={"steps": 3})
    assert line.endswith("\n") and json.loads(line) == {"event": "done", "result": {"steps": 3}}
    assert control.command(control.Cmd.RUN, config="c.json") == {"cmd": "run", "config": "c.json"}
    with pytest.raises(ValueError, match="stop"):
        control.command("stop")
    with pytest.raises(ValueError, match="finished"):
        control.event_line("finished")
