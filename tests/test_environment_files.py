"""environment.yml (conda) and pyproject.toml (pip) must ask for the same packages."""

import re
import tomllib

from helpers.config import REPO_ROOT

# pyproject pins `~=X.Y.Z` (X.Y.* from Z); conda-forge pins `=X.Y` (X.Y.*). Same range.
ALIASES = {"tensorflow-cpu": "tensorflow"}  # the CPU wheel is the same TF, packaged smaller


def pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for dep in project["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)~=(\d+)\.(\d+)\.\d+\s*(;.*)?", dep)
        assert m, f"pyproject dependency {dep!r} is not a compatible-release pin X~=A.B.C"
        name = ALIASES.get(m[1].lower(), m[1].lower())
        pin = f"{m[2]}.{m[3]}"
        assert pins.setdefault(name, pin) == pin, f"{name} pinned twice differently"
    return pins


def environment_pins() -> tuple[dict[str, str], str]:
    pins, python = {}, None
    for raw in (REPO_ROOT / "environment.yml").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("- ") or line in ("- conda-forge", "- pip", "- pip:"):
            continue
        spec = line[2:].strip()
        conda = re.fullmatch(r"([A-Za-z0-9_.-]+)=(\d+)\.(\d+)", spec)
        pip = re.fullmatch(r"([A-Za-z0-9_.-]+)~=(\d+)\.(\d+)\.\d+", spec)
        m = conda or pip
        assert m, f"environment.yml line {raw.strip()!r} is not name=X.Y or name~=X.Y.Z"
        if m[1] == "python":
            python = f"{m[2]}.{m[3]}"
        else:
            pins[m[1].lower()] = f"{m[2]}.{m[3]}"
    assert "# " in (REPO_ROOT / "environment.yml").read_text()
    return pins, python


def test_both_files_pin_the_same_packages_to_the_same_series():
    ours, (conda, python) = pyproject_pins(), environment_pins()
    assert conda == ours
    assert python == "3.11"


def test_every_conda_dependency_says_why_it_is_there():
    for raw in (REPO_ROOT / "environment.yml").read_text().splitlines():
        line = raw.strip()
        if line.startswith("- ") and line not in ("- conda-forge", "- pip", "- pip:"):
            assert "#" in line and line.split("#", 1)[1].strip(), f"no reason given: {line!r}"


def test_python_floor_matches_environment():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    assert "tf_keras" not in (REPO_ROOT / "pyproject.toml").read_text()
