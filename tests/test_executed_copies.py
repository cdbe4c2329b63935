"""What `make run` writes to build/: no stray stderr, progress bars and cluster dashboards in
their final state, and the timelines.

Notebooks 01, 02 and 05 run in quick mode through the runner itself (tools.run_notebooks);
`make test` leaves them out of its nbval run (the Makefile's RUNNER_CHECKED), so each runs once.
The HTML of notebooks 01 and 05 is then opened in headless Chromium with the network off, to
check what a reader of the rendered lesson sees.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import nbformat
import pytest

from helpers.system import netns
from tools.notebooks import NOTEBOOK_DIR, STDERR_ALLOWED
from tools.run_notebooks import run_one

# executes notebooks through the runner: `make unit` leaves it out
pytestmark = pytest.mark.slow

NOTEBOOKS = ("01_doc2vec_dbpedia", "02_logreg_lr_schedules", "05_parameter_server")
BAR = re.compile(r"(\d+)%\|[█▏▎▍▌▋▊▉ ]*\| *(\d+)/(\d+)")


@pytest.fixture(scope="module")
def build(tmp_path_factory, shared_data):
    """Execute the notebooks once, in quick mode, into a fresh build folder."""
    out = tmp_path_factory.mktemp("build")
    with pytest.MonkeyPatch.context() as env:  # the kernels inherit this environment
        env.setenv("LABS_QUICK", "1")
        env.setenv("LABS_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
        env.setenv("LABS_DATA_MIRROR", str(shared_data))
        env.setenv("LABS_DBPEDIA_DIR", str(shared_data / "dbpedia_subset"))
        # as `make run` on a student's machine: CI's MPLBACKEND=Agg would keep every figure
        # out of the executed copies (the kernels' inline backend draws them)
        env.delenv("MPLBACKEND", raising=False)
        for name in NOTEBOOKS:
            status, _, error, _ = run_one(
                NOTEBOOK_DIR / f"{name}.ipynb", out, 600, show_progress=False
            )
            assert status == "ok", f"{name}: {error}"
    return out


def outputs(path):
    nb = nbformat.read(str(path), as_version=4)
    return [(i, out) for i, cell in enumerate(nb.cells) for out in cell.get("outputs", [])]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_cell_writes_to_stderr(build, name):
    stray = [
        (i, line)
        for i, out in outputs(build / f"{name}.ipynb")
        if out.get("name") == "stderr"
        for line in out["text"].splitlines()
        if line.strip() and not any(re.search(p, line) for p in STDERR_ALLOWED)
    ]
    assert not stray, "\n".join(f"cell {i}: {line}" for i, line in stray[:20])


# TF's own log lines, wherever a cell's stream put them (its Python logger may write to
# stdout in a kernel): the causes that are ours are fixed, the rest silenced in helpers/.
TF_NOISE = re.compile(r"WARNING:tensorflow|INFO:tensorflow|retracing|absl::|cpu_feature_guard")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_tensorflow_log_lines_in_any_output(build, name):
    noise = [
        (i, line)
        for i, out in outputs(build / f"{name}.ipynb")
        if out.get("output_type") == "stream"
        for line in out["text"].splitlines()
        if TF_NOISE.search(line)
    ]
    assert not noise, "\n".join(f"cell {i}: {line}" for i, line in noise[:20])


def bars(path) -> list[str]:
    texts = [out.get("data", {}).get("text/plain", "") for _, out in outputs(path)]
    return [t for t in texts if BAR.search(t)]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_progress_bars_show_their_final_count(build, name):
    found = bars(build / f"{name}.ipynb")
    assert found or name != NOTEBOOKS[0], "no progress bar in the executed copy"  # 02's are closed
    for text in found:
        percent, done, total = BAR.search(text).groups()
        assert percent == "100" and done == total, text
    assert not any(
        "widget-view" in str(out.get("data", {})) for _, out in outputs(build / f"{name}.ipynb")
    ), "a widget output is left: it renders only with a widget manager"


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def rendered_dom(page, tmp_path) -> str:
    """The DOM of an HTML file as headless Chromium renders it, offline."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)")
    # The network off: a namespace with no interface where the OS allows it, and in any case a
    # proxy that refuses every connection, so the page can fetch nothing (no CDN, no widgets).
    prefix = [] if netns.unavailable_reason() else ["unshare", "--user", "--map-root-user", "--net"]
    dom = subprocess.run(
        prefix
        + [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--proxy-server=http://127.0.0.1:9",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0 and "<body" in dom.stdout, dom.stderr[-2000:]
    return dom.stdout


def visible_text(dom: str) -> str:
    parser = _Text()
    parser.feed(dom)
    return " ".join(" ".join(parser.parts).split())


def test_the_rendered_page_shows_the_finished_bars_offline(build, tmp_path):
    text = visible_text(rendered_dom(build / "01_doc2vec_dbpedia.html", tmp_path))
    expected = bars(build / "01_doc2vec_dbpedia.ipynb")
    assert expected
    for bar in expected:
        assert " ".join(bar.split()) in text, f"{bar!r} is not on the rendered page"
    assert not re.search(r"\b0%\|", text), "a bar at 0% is on the rendered page"


def test_the_rendered_cluster_lesson_shows_final_dashboards_and_timelines(build, tmp_path):
    """05: each 3-worker run's dashboard in its last frame (every worker done), and the
    timeline figures as images, in the page a reader opens offline."""
    dom = rendered_dom(build / "05_parameter_server.html", tmp_path)
    finals = re.findall(r"<div class=\"labs-dashboard labs-dashboard-final\".*?</table>", dom, re.S)
    assert len(finals) == 4, f"{len(finals)} final dashboards (one per 3-worker run expected)"
    for frame in finals:
        text = visible_text(frame)
        assert "finished" in text and text.count(" done ") == 3, text
    assert "labs-dashboard-live" not in dom  # no live frame left behind
    text = visible_text(dom)
    assert "One step at a time: the timeline" in text
    images = re.findall(r"<img[^>]+src=\"data:image/png;base64,", dom)
    figures = [
        i
        for i, out in outputs(build / "05_parameter_server.ipynb")
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == len(figures) and figures, (len(images), figures)
    timeline = [
        i
        for i, cell in enumerate(
            nbformat.read(str(build / "05_parameter_server.ipynb"), as_version=4).cells
        )
        if ".timeline(" in cell.source
    ]
    assert timeline and set(timeline) <= set(figures)  # the timelines are drawn as images
