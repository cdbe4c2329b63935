"""What the live dashboard costs a run: steps/s of a 2-worker async logistic-regression run with
the dashboard and without it, side by side in one run of this script, in a real Jupyter kernel.

The kernel (started through nbclient, as `make run` does) starts one cluster and alternates
runs without the dashboard (progress=False) and with its widget (progress="widget": the
kernel renders a frame up to 4 times a second and sends it over the widget protocol, as in
JupyterLab; a text line every few seconds is the fallback outside a kernel and costs less).
Each mode gets REPEATS runs, interleaved A B A B ..., so the machine's drift hits both alike;
the medians and their ratio are printed and written to runs/bench/dashboard_cost.json.
Target (issue 30): with / without >= 0.95.
Usage: python -m bench.dashboard_cost [--repeats N] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import statistics

import nbformat
from nbclient import NotebookClient
from traitlets.config import Config

from helpers import config, files

CODE = """
import json
from helpers.cluster import LocalCluster
rates = {{"without": [], "with": []}}
with LocalCluster(workers=2, isolate="auto") as c:
    c.train(mode="async", steps=100, train_size=6000, test_size=500, progress=False, seed=0)
    for i in range({repeats}):
        for name, progress in (("without", False), ("with", "widget")):
            run = c.train(mode="async", steps={steps}, batch_size=64, lr=0.2, train_size=6000,
                          test_size=500, progress=progress, seed=i)
            rates[name].append(run.summary()["steps_per_s"])
print("RATES" + json.dumps(rates))
"""


def measure(repeats: int, steps: int) -> dict:
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(CODE.format(repeats=repeats, steps=steps))]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    # CurveZMQ keys from the kernel manager, as tools/run_notebooks.py: encrypted, and quiet
    NotebookClient(
        nb,
        timeout=1800,
        kernel_name="python3",
        config=Config({"KernelManager": {"transport_encryption": "required"}}),
    ).execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
    frames = sum(
        "labs-dashboard-final" in o.get("data", {}).get("text/html", "")
        for o in nb.cells[0].outputs
    )
    rates = json.loads(text.split("RATES", 1)[1].splitlines()[0])
    return {"rates": rates, "final_frames_shown": frames}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per mode (default 5)")
    parser.add_argument("--steps", type=int, default=1500, help="PS updates per run")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps < 50:
        parser.error(f"--repeats must be >= 1 and --steps >= 50, got {args.repeats}, {args.steps}")
    result = measure(args.repeats, args.steps)
    if result["final_frames_shown"] != args.repeats:  # the widget really ran in every "with" run
        raise SystemExit(
            f"expected {args.repeats} final dashboard frames, found {result['final_frames_shown']}"
        )
    med = {name: statistics.median(v) for name, v in result["rates"].items()}
    result["median_steps_per_s"] = med
    result["ratio_with_over_without"] = med["with"] / med["without"]
    print("| dashboard | steps/s, each run | median |\n|---|---|---|")
    for name, values in result["rates"].items():
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | {med[name]:.1f} |")
    print(
        f"\nwith / without: {result['ratio_with_over_without']:.3f} (target >= 0.95); "
        f"final frames shown: {result['final_frames_shown']}"
    )
    out = config.runs_dir("bench") / "dashboard_cost.json"
    with files.atomic_path(out) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
