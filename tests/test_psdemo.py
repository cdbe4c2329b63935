"""The parameter-server demo of notebook 05: named resources are shared, plain variables are
not, and every process it starts is gone when it returns, also on a timeout."""

import psutil
import pytest

from helpers.cluster import psdemo

# starts tf.distribute.Server processes: `make unit` leaves it out
pytestmark = pytest.mark.slow


def _alive(pids):
    return [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def test_demo_shares_named_resources_only_and_leaves_nothing():
    reports = psdemo.run_demo()
    by_role = {r["role"]: r for r in reports if "plain_value" in r}
    a, b = by_role["client A"], by_role["client B"]
    assert a["plain_device"].startswith("/job:ps/replica:0/task:0")
    assert (a["plain_value"], b["plain_value"]) == (1.0, 1.0)  # two anonymous variables
    assert (a["shared_value"], b["shared_value"]) == (1.0, 2.0)  # one named variable
    assert b["letters"] == [f"hello from pid {a['pid']}", f"hello from pid {b['pid']}"]
    assert reports[-1]["still_running"] is True  # the PS served until the driver ended it
    assert _alive({r["pid"] for r in reports}) == []


def test_demo_timeout_raises_and_ends_every_process():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="took more than 1 s and was ended"):
        psdemo.run_demo(timeout=1.0)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert _alive(after - before) == []
