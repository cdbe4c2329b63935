"""Where students see it: notebook 05 (quick mode) in JupyterLab, in a real browser.

JupyterLab runs headless on loopback with a token; Playwright drives Debian's `chromium`
through its executable path (no browser download). The test runs the notebook's cells and
watches the page: the live dashboard appears while a 3-worker run trains, its worker rows
change as a run goes on (in one of the first three runs: on a loaded machine a short run can
end before a frame shows its steps), and the first run's final frame stays after the live
widget is gone.
Then the server is stopped and every process it started is checked gone, by PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from helpers.system.processes import free_ports
from tools.notebooks import NOTEBOOK_DIR

# starts JupyterLab, a kernel and a cluster: `make unit` leaves it out
pytestmark = pytest.mark.slow

NOTEBOOK = "05_parameter_server.ipynb"
LIVE_ROWS = ".labs-dashboard-live .labs-workers"
FINAL = ".labs-dashboard-final"
RUNS_WATCHED = 3


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)")
    return path


class Lab:
    """A JupyterLab server on loopback: its page URL, REST API, process and folder."""

    def __init__(self, base, token, server, folder):
        self.base, self.token, self.server, self.folder = base, token, server, folder
        self.url = f"{base}/lab/tree/{NOTEBOOK}?token={token}"

    def api(self, path: str, body: dict | None = None) -> dict:
        """GET (or POST `body` to) the server's REST API at /api/`path`."""
        request = urllib.request.Request(
            f"{self.base}/api/{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read() or b"{}")

    def start_kernel(self) -> str:
        """The notebook's session and its kernel, started through the REST API before the page
        opens (the server answers once the kernel process is up): JupyterLab then joins this
        session instead of starting a kernel of its own. Left to the page, a start on a loaded
        CI machine once began two kernels 0.2 s apart, shut the first down, and left the page's
        cells queued ([*]) with no kernel running them."""
        body = {
            "path": NOTEBOOK,
            "name": NOTEBOOK,
            "type": "notebook",
            "kernel": {"name": "python3"},
        }
        try:
            return self.api("sessions", body)["kernel"]["id"]
        except OSError as exc:  # e.g. HTTP 500: the kernel did not start
            pytest.fail(f"JupyterLab did not start the kernel: {exc}\n{kernel_story(self)}")

    def descendants(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.server.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """SIGTERM: Jupyter shuts its kernels down and exits; SIGKILL if it does not."""
        if self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()


def _running(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture
def lab(tmp_path, shared_data):
    """JupyterLab serving a copy of notebook 05, with quick mode and the shared data."""
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(NOTEBOOK_DIR / NOTEBOOK, root / NOTEBOOK)
    port, token = free_ports(1)[0], os.urandom(16).hex()
    env = dict(
        os.environ,
        LABS_QUICK="1",
        LABS_RUNS_DIR=str(tmp_path / "runs"),
        LABS_DATA_MIRROR=str(shared_data),
        LABS_DBPEDIA_DIR=str(shared_data / "dbpedia_subset"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
        # the kernel's IPython profile and history database: its own, not shared with the
        # kernels other tests run at the same time
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    env.pop("LABS_DASHBOARD", None)
    env.pop("JUPYTER_PATH", None)
    with open(tmp_path / "lab.log", "wb") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
            ]
            + (["--allow-root"] if os.geteuid() == 0 else []),  # CI's containers run as root
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, server, tmp_path)
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                lab.api("status")
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "JupyterLab did not answer in 120 s"
                time.sleep(0.5)
        yield lab
    finally:  # whatever the test did: end the server, then by PID anything it left
        seen += lab.descendants()
        lab.stop()
        for pid in _running(seen):
            os.kill(pid, signal.SIGKILL)


KERNEL_EVENTS = re.compile(
    r"Kernel started|Kernel shutdown|Restarter|restart|died|alive|Starting kernel|"
    r"Error|Killed|Traceback"
)


def kernel_story(lab) -> str:
    """What CI prints when no kernel ran the notebook: the kernel's life in JupyterLab's log
    (each start, restart, death and error line, not the whole log, which CI's output cuts),
    the kernel processes alive now, and the machine's free memory and disk."""
    lines = (lab.folder / "lab.log").read_text(errors="replace").splitlines()
    events = [line[:240] for line in lines if KERNEL_EVENTS.search(line)]
    alive = []
    for pid in lab.descendants():
        try:
            p = psutil.Process(pid)
            alive.append(f"{pid} {p.status()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    disk = shutil.disk_usage(lab.folder)
    return (
        f"JupyterLab's log: {len(lines)} lines; its kernel events (last 40):\n  "
        + "\n  ".join(events[-40:])
        + "\nJupyterLab's processes now:\n  "
        + ("\n  ".join(alive) or "none")
        + f"\nfree memory {psutil.virtual_memory().available / 2**30:.1f} GiB, "
        f"free disk {disk.free / 2**30:.1f} GiB"
    )


def wait_for_kernel(page, lab) -> None:
    """Wait until the page shows its kernel connected and idle. Until then JupyterLab's Run
    All Cells is enabled but the page has no kernel: each code cell it runs asks which kernel
    to start, and answering starts a new one in place of the session's (CI saw 38 such
    questions, one per code cell, and the session's kernel gone). The status indicator alone
    can read idle before the page has a kernel (seen with the server stalled), so the toolbar's
    kernel name must be the notebook's too."""
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    named = page.locator(".jp-Toolbar-kernelName", has_text="Python 3")  # not "No Kernel"
    try:
        named.first.wait_for(timeout=180_000)
        idle.first.wait_for(timeout=180_000)
    except PlaywrightError:
        pytest.fail(f"the page never showed its kernel idle in 180 s\n{kernel_story(lab)}")


def answer_dialog(dialog, kernel: str) -> str:
    """Answer one JupyterLab dialog and return its text. Asked to select a kernel, pick the
    session's own (listed under its notebook's name and the first 8 characters of its id)
    rather than the default, a new kernel that would replace it."""
    text = " ".join((dialog.text_content() or "").split())
    for option in dialog.locator("option").all():
        if kernel and kernel[:8] in (option.text_content() or ""):
            dialog.locator("select").first.select_option(option.get_attribute("value"))
            break
    dialog.locator(".jp-Dialog-button.jp-mod-accept").first.click()
    return text


def click_run_all(page, lab, kernel: str) -> None:
    """Run > Run All Cells, as a student would, once the page shows its kernel; try again
    until a cell shows it was queued or ran ([*] or a number)."""
    wait_for_kernel(page, lab)
    queued = page.locator(".jp-InputPrompt", has_text=re.compile(r"\[(\*|\d+)\]"))
    deadline = time.monotonic() + 180
    asked: dict[str, int] = {}
    while time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog")
        if dialog.count():  # say which, and how often: a dialog here is a surprise
            text = answer_dialog(dialog.first, kernel)
            asked[text] = asked.get(text, 0) + 1
            if asked[text] == 1:
                print("JupyterLab asked:", text)
            time.sleep(1)
            continue
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        item = page.locator(".lm-Menu-item:not(.lm-mod-disabled)", has_text="Run All Cells")
        if item.count():
            item.first.click()
            try:
                queued.first.wait_for(timeout=15_000)
                if asked:
                    print("JupyterLab's dialogs, and how often each was answered:", asked)
                return
            except PlaywrightError:
                pass
        else:
            page.keyboard.press("Escape")  # close the menu, wait for the kernel
        time.sleep(2)
    pytest.fail(f"Run All Cells never started the notebook in 180 s\n{kernel_story(lab)}")


def session_kernel(lab) -> tuple[str, str]:
    """The notebook's session's kernel now (its id and execution state): JupyterLab's page can
    replace the kernel it was given, so this asks the server rather than remembering one."""
    for session in lab.api("sessions"):
        if session.get("path") == NOTEBOOK and session.get("kernel"):
            kernel = session["kernel"]
            return kernel["id"], kernel.get("execution_state", "?")
    return "", "none"


def run_until_live(page, lab, kernel: str) -> None:
    """Run All Cells and wait for the first live dashboard (the notebook's first 3-worker run).
    A page whose cells sit queued ([*]) while the session's kernel stays idle for 60 s has lost
    its kernel (a stalled server does that to JupyterLab: it started a new kernel in place of
    the session's, ran one cell on it and queued the rest for good): reload the page once, as a
    student would, and run all again; a second stall fails with what the server saw."""
    queued = page.locator(".jp-InputPrompt", has_text="[*]")
    for attempt in (1, 2):
        click_run_all(page, lab, kernel)
        deadline, idle_since = time.monotonic() + 600, None
        while time.monotonic() < deadline:
            try:
                page.wait_for_selector(LIVE_ROWS, timeout=5_000)
                return
            except PlaywrightError:
                pass
            kernel, state = session_kernel(lab)
            stalled = state == "idle" and queued.count() > 0
            idle_since = (idle_since or time.monotonic()) if stalled else None
            if idle_since and time.monotonic() - idle_since > 60:
                break
        else:
            break  # no stall, no dashboard: fail below
        if attempt == 1:
            print("cells queued and the kernel idle for 60 s: reloading the page")
            page.reload()
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    errors = page.locator(".jp-OutputArea-output[data-mime-type*='error']")
    pytest.fail(
        f"no live dashboard (the session's kernel: {session_kernel(lab)})\n"
        + kernel_story(lab)
        + f"\ncell errors on the page: {errors.all_text_contents()[:3]}"
    )


def screenshot(page, selector, path, tries=5) -> None:
    """A picture of the first `selector` on the page, to look at after a failure. While later
    cells' outputs arrive, JupyterLab can re-render the output the element sits in, so the
    element found can be detached a moment later (CI saw "Element is not attached to the
    DOM"): look it up again and retry."""
    for _ in range(tries):
        try:
            element = page.locator(selector).first
            element.scroll_into_view_if_needed(timeout=5_000)
            element.screenshot(path=str(path), timeout=10_000)
            return
        except PlaywrightError:
            time.sleep(1)
    page.screenshot(path=str(path))  # what the page showed instead


def test_the_dashboard_runs_live_in_jupyterlab_and_leaves_its_final_frame(lab):
    chromium = _chromium()
    frames: dict[int, list[str]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            kernel = lab.start_kernel()
            page.goto(lab.url)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            run_until_live(page, lab, kernel)
            # each run's live rows, by the number of runs finished before it: a short run on a
            # loaded machine can end before a frame shows its first steps (CI saw one whose
            # every frame said "starting"), so up to RUNS_WATCHED runs are watched for one
            # whose rows change
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                finished = page.locator(FINAL).count()
                changed = any(len(set(f)) >= 2 for f in frames.values())
                if finished >= RUNS_WATCHED or (finished and changed):
                    break
                try:
                    rows = page.locator(LIVE_ROWS).first.text_content(timeout=1_000)
                    frames.setdefault(finished, []).append(rows)
                except PlaywrightError:  # the widget was closed between two looks
                    pass
                time.sleep(0.1)
            final = page.locator(FINAL).first
            final.wait_for(timeout=60_000)
            final_text = " ".join(final.text_content().split())
            final_rows = page.locator(f"{FINAL} .labs-workers").first.text_content()
            screenshot(page, FINAL, lab.folder / "dashboard-final.png")
            processes = lab.descendants()  # the kernel and its cluster, while they run
        finally:
            browser.close()
    assert any(len(set(f)) >= 2 for f in frames.values()), (
        f"the live rows never changed in {len(frames)} run(s): "
        + str({run: f[:3] for run, f in frames.items()})
    )
    assert "finished" in final_text and "PS version" in final_text, final_text
    assert final_rows.count("done") == 3, final_rows  # each of the 3 workers' rows
    assert len(processes) >= 5, processes  # kernel, PS, 3 workers (and a namespace holder)
    lab.stop()  # what a student's closing of JupyterLab does
    deadline = time.monotonic() + 15  # the kernel's cluster ends with it (its lifeline)
    while _running(processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _running(processes), f"left after JupyterLab stopped: {_running(processes)}"
