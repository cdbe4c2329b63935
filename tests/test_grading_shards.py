"""SHARD=i/m and the scheduler examples that set it (the grading itself: tests/test_course.py)."""

import os
import subprocess

import pytest
import yaml

from helpers.config import REPO_ROOT
from tools.course.shards import parse_shard

EXAMPLES = REPO_ROOT / "examples" / "grading"


def test_shard_is_i_of_m_or_m_with_the_index_from_slurm_or_kubernetes():
    assert parse_shard("1/4", {}) == (1, 4)
    assert parse_shard("4", {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5"}) == (2, 4)
    assert parse_shard("4", {"JOB_COMPLETION_INDEX": "3"}) == (3, 4)
    assert parse_shard("0/4", {"JOB_COMPLETION_INDEX": "3"}) == (0, 4)  # explicit wins


@pytest.mark.parametrize(
    "spec, env, message",
    [
        ("4/4", {}, r"SHARD=4/4: shard 4 of 4 does not exist; shards are numbered 0 to 3"),
        ("a/b", {}, r"SHARD=a/b is not i/m with whole numbers"),
        ("4", {}, r"SHARD=4 gives the number of shards only, and neither SLURM_ARRAY_TASK_ID"),
        ("2", {"JOB_COMPLETION_INDEX": "2"}, r"shard 2 of 2 does not exist"),
    ],
)
def test_a_bad_shard_names_the_value_and_what_to_give(spec, env, message):
    with pytest.raises(ValueError, match=message):
        parse_shard(spec, env)


def test_the_slurm_script_is_valid_bash_and_refuses_to_run_outside_an_array_job():
    script = EXAMPLES / "slurm-grade.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    run = subprocess.run(["bash", str(script), "subs"], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "run me as a Slurm array job" in run.stderr
    text = script.read_text()
    assert 'SHARD="$tasks"' in text and "make grade-merge" in text


def test_the_kubernetes_job_is_indexed_and_gives_every_pod_the_shard_count():
    job = yaml.safe_load((EXAMPLES / "k8s-grade-job.yaml").read_text())
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["SHARDS"]) == spec["completions"] == spec["parallelism"]
    assert 'SHARD="$SHARDS"' in " ".join(container["args"])
