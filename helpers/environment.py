"""Report what this machine offers the notebooks: versions, devices, data, mode."""
from __future__ import annotations

import importlib.metadata as md
import platform
import sys

from helpers import config
from helpers.data import downloads

PACKAGES = ["tensorflow", "tensorflow-cpu", "keras", "gensim", "scikit-learn", "numpy",
            "pandas", "matplotlib", "ipywidgets", "psutil", "nbval"]


def versions() -> dict[str, str]:
    """Installed versions of the packages the notebooks rely on."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def report():
    """Return a two-column DataFrame: versions, TF devices, datasets, quick mode."""
    import pandas as pd
    import tensorflow as tf

    rows = list(versions().items())
    devices = tf.config.list_physical_devices()
    rows.append(("TF devices", ", ".join(d.name.replace("/physical_device:", "") for d in devices)))
    rows.append(("GPU", "yes" if tf.config.list_physical_devices("GPU") else
                 "none visible: training runs on the CPU"))
    rows += [(f"dataset {k}", v) for k, v in downloads.available().items()]
    rows.append(("quick mode", "on (LABS_QUICK)" if config.is_quick() else "off: full lessons"))
    rows.append(("data cache", str(config.data_dir())))
    rows.append(("run outputs", str(config.runs_dir(create=False))))
    return pd.DataFrame(rows, columns=["item", "value"]).set_index("item")
