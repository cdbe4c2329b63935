"""Execute every notebook in order and write executed copies (.ipynb + .html) to build/.

While a notebook runs, a progress bar shows its cells done, the section it is in and the
elapsed time, and a thread samples the memory of the kernel and every process it started.
Ends with a table of notebook, status, wall time and peak memory; exits 1 if any notebook
failed, 130 if interrupted (Ctrl-C).
"""

from __future__ import annotations

if (
    __name__ == "__main__" and not __package__
):  # run as a file: become `python -m tools.run_notebooks`
    from helpers.system.processes import exec_as_module

    exec_as_module("tools.run_notebooks")

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import HTMLExporter
from tqdm import tqdm
from traitlets.config import Config

import helpers  # noqa: F401  (sets the kernels' TF log level: they inherit os.environ)
from helpers import config
from helpers.files import atomic_path
from helpers.system.resources import Sampler, read_memory, total_memory
from tools.notebooks import NOTEBOOK_DIR, freeze_widgets, notebook_paths, read

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in tracebacks
BUILD = Path(__file__).resolve().parent.parent / "build"


def record_run_time(
    name: str, mode: str, seconds: float, folder: Path = NOTEBOOK_DIR, memory: dict | None = None
) -> None:
    """Store one notebook's measured wall time for `mode` ("full" or "quick") in the run times
    of `folder` (config.run_times_path), and its peak memory (`MemoryPeak.summary()`) when
    given; `make index` turns them into each notebook's "Expected run time" line."""
    times = config.run_times(folder)
    times.setdefault(name, {})[mode] = {
        "seconds": round(seconds, 1),
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        **(memory or {}),
    }
    with atomic_path(config.run_times_path(folder)) as tmp:
        tmp.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")


class MemoryPeak:
    """Track the peak memory of every process this one started (the kernel and whatever it
    starts: cluster nodes, worker processes) while a notebook runs.

    PSS splits shared pages between the processes that map them, so the sum is what they cost
    together; but reading it walks each process's page tables (~35 ms for a TF process), too
    slow to do often beside a lesson that times itself. So every `interval` s this sums RSS
    (cheap), and reads PSS only when that sum reaches a new high by `grow` or more. A peak
    between two samples is missed: the figures are lower bounds.
    """

    def __init__(self, interval: float = 1.0, grow: float = 1.05):
        self.grow = grow
        self.total, self.largest, self.count, self._rss_seen = 0, 0, 0, 0
        self._sampler = Sampler(self._sample, interval)

    def _sample(self) -> None:
        procs = psutil.Process().children(recursive=True)
        rss = total_memory(procs)
        if rss < self._rss_seen * self.grow:
            return
        self._rss_seen = rss
        sizes = []
        for proc in procs:
            try:
                pss = read_memory(proc, full=True).pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if pss is not None:  # None: a system without PSS (macOS): nothing to add
                sizes.append(pss)
        if sum(sizes) > self.total:
            self.total, self.count = sum(sizes), len(sizes)
        self.largest = max([self.largest, *sizes])

    def __enter__(self):
        self._sampler.start()
        return self

    def __exit__(self, *exc):
        self._sampler.stop()
        return False

    def summary(self) -> dict:
        """Peak PSS of all processes together and of the largest one (MB), and how many
        processes ran at the peak; {} when nothing was measured."""
        if not self.total:
            return {}
        return {
            "peak_pss_mb": round(self.total / 2**20),
            "largest_process_mb": round(self.largest / 2**20),
            "processes_at_peak": self.count,
        }


class LessonClient(NotebookClient):
    """nbclient that also remembers which widgets were closed while the notebook ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.closed_widgets: set[str] = set()

    def handle_comm_msg(self, outs, msg, cell_index):
        if msg["msg_type"] == "comm_close":  # e.g. a tqdm bar with leave=False
            self.closed_widgets.add(msg["content"]["comm_id"])
        super().handle_comm_msg(outs, msg, cell_index)


def interrupted(client: NotebookClient) -> bool:
    """True if SIGINT reached nbclient's handler (it schedules the kernel's shutdown)."""
    return getattr(client, "_async_cleanup_kernel_future", None) is not None


def progress_hooks(bar: tqdm) -> dict:
    """nbclient hooks that move `bar` one step per code cell and show the current section."""

    def on_cell_start(cell, cell_index):
        if cell.cell_type == "markdown":
            heading = next(
                (h.lstrip("#").strip() for h in cell.source.splitlines() if h.startswith("## ")),
                None,
            )
            if heading:
                bar.set_postfix_str(heading[:50])

    def on_cell_executed(cell, cell_index, execute_reply):
        bar.update(1)

    return {"on_cell_start": on_cell_start, "on_cell_executed": on_cell_executed}


def run_one(
    path: Path, out_dir: Path, timeout: int, show_progress: bool = True
) -> tuple[str, float, str, dict]:
    """Execute one notebook; write its executed copy and HTML; return (status, seconds, error,
    peak memory)."""
    nb = read(path)
    n_code = sum(c.cell_type == "code" and bool(c.source.strip()) for c in nb.cells)
    bar = tqdm(
        total=n_code,
        desc=path.stem,
        unit="cell",
        disable=not show_progress,
        bar_format="{desc}: {n}/{total} cells [{elapsed}]{postfix}",
        file=sys.stdout,
    )
    # CurveZMQ keys provisioned by the kernel manager: the kernel's sockets are encrypted, and
    # ipykernel no longer warns that it runs over TCP without encryption.
    client = LessonClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        config=Config({"KernelManager": {"transport_encryption": "required"}}),
        resources={"metadata": {"path": str(path.parent)}},
        **progress_hooks(bar),
    )
    t0 = time.perf_counter()
    status, error = "ok", ""
    memory = MemoryPeak()
    try:
        with memory:
            client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        lines = ANSI.sub("", str(exc)).strip().splitlines()
        # a timeout's message ends with the cell's source between dashes: its first line says it
        line = lines[0] if isinstance(exc, CellTimeoutError) else lines[-1]
        status, error = "FAILED", line[:200]
        client.set_widgets_metadata()  # nbclient stores the bars' states only after a success
    except (KeyboardInterrupt, AssertionError):
        # nbclient handles SIGINT itself: it shuts the kernel down and then trips over its
        # own cleanup (AssertionError "self.km is not None") or reports a dead kernel.
        if not interrupted(client):
            raise
    finally:
        bar.close()
    if interrupted(client):
        status, error = "INTERRUPTED", "interrupted by the user (Ctrl-C)"
    seconds = time.perf_counter() - t0
    freeze_widgets(nb, client.closed_widgets)
    nbformat.write(nb, str(out_dir / path.name))
    html, _ = HTMLExporter().from_notebook_node(nb)
    (out_dir / path.with_suffix(".html").name).write_text(html, encoding="utf-8")
    return status, seconds, error, memory.summary()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--quick", action="store_true", help="set LABS_QUICK=1 for the kernels")
    parser.add_argument("--only", default="", help="run only notebooks whose name contains this")
    parser.add_argument("--out", type=Path, default=BUILD)
    parser.add_argument("--dir", type=Path, default=NOTEBOOK_DIR, help="folder of notebooks")
    parser.add_argument(
        "--record-times",
        action="store_true",
        help=f"store each successful notebook's wall time in {config.RUN_TIMES_FILE}",
    )
    args = parser.parse_args(argv)
    if args.quick:
        os.environ["LABS_QUICK"] = "1"
    backend = os.environ.pop("MPLBACKEND", "")
    if backend and "inline" not in backend:
        # the kernels inherit this environment, and ipykernel draws figures into the
        # notebook only when MPLBACKEND is unset: the executed copies would have none
        print(f"MPLBACKEND={backend} is set: the kernels leave it out, to draw their figures")
    from helpers.config import is_quick  # the kernels' own rule, so both agree on the mode

    mode = "quick" if is_quick() else "full"
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [p for p in notebook_paths(args.dir) if args.only in p.name]
    results = []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.name} ({mode} mode)", flush=True)
        status, seconds, error, memory = run_one(path, args.out, args.timeout)
        peak = f"{memory['peak_pss_mb']:,} MB" if memory else "?"
        results.append((path.name, status, seconds, error, peak))
        print(f"  {status} in {seconds:.0f} s, peak memory {peak} {error}", flush=True)
        if status == "ok" and args.record_times:
            record_run_time(path.stem, mode, seconds, args.dir, memory)
        if status == "INTERRUPTED":
            break
    print(
        f"\n| notebook | status | wall time | peak memory (PSS) | mode: {mode}, copies in "
        f"{args.out} |"
    )
    print("| --- | --- | ---: | ---: | --- |")
    for name, status, seconds, error, peak in results:
        print(f"| {name} | {status} | {seconds / 60:.1f} min | {peak} | {error} |")
    total = sum(r[2] for r in results)
    print(
        f"| total | {sum(r[1] == 'ok' for r in results)}/{len(paths)} ok | {total / 60:.1f} min "
        "| | |"
    )
    if any(r[1] == "INTERRUPTED" for r in results):
        return 130  # the shell's code for "stopped by SIGINT"
    return 0 if all(r[1] == "ok" for r in results) and len(results) == len(paths) else 1


if __name__ == "__main__":
    sys.exit(main())
