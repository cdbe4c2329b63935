"""Kubernetes: the manifests pass Kubernetes' own schemas (kubernetes-validate) and the TFJob its
CRD's (tests/data/kubeflow.org_tfjobs.yaml), for every mode and PS count; the command in the
manifests runs each pod's node for real (on this machine, in a private network namespace); bad
input is refused by name. No Kubernetes cluster here: what is not tested is in docs/cluster.md.
"""

import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.cluster import kube, protocol
from helpers.cluster.rundir import RunDir, read_events
from helpers.system import netns
from helpers.system.processes import log_tail

HERE = Path(__file__).parent
CRD = HERE / "data" / "kubeflow.org_tfjobs.yaml"
CRD_SHA256 = "1fea6d2d9d3fec4697db322d4490be67b0d616478f42566e4c48ae865130a8c8"  # SOURCES.md
# the oldest and the newest Kubernetes whose schemas kubernetes-validate ships
K8S_VERSIONS = ("1.25.0", "1.37.0")
# TFJob's webhook (training-operator v1.9.0, pkg/webhooks/tensorflow/tfjob_webhook.go): the
# replica types it accepts, and the container it sets TF_CONFIG in
TF_REPLICA_TYPES = {"Chief", "PS", "Worker", "Evaluator", "Master"}

if "kubernetes_validate" in os.environ.get("LABS_TESTS_REQUIRE", ""):
    import kubernetes_validate  # .ci/run installs the extra and requires it: no silent skip
else:
    try:
        import kubernetes_validate
    except ImportError:  # a student's environment: only the schema checks skip
        kubernetes_validate = None


def _strict(schema):
    """A CRD's structural schema as the API server's strict field validation reads it
    (`kubectl apply --validate=strict`): an object's fields are the ones it lists, unless it
    preserves unknown fields or takes any key (additionalProperties)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            if isinstance(value, dict):
                walk(value)
            elif isinstance(value, list):
                for item in value:
                    walk(item)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def tfjob_schema():
    body = CRD.read_bytes()
    assert hashlib.sha256(body).hexdigest() == CRD_SHA256, "update tests/data/SOURCES.md too"
    crd = yaml.safe_load(body)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def _k8s_valid(doc):
    if kubernetes_validate is None:
        pytest.skip("pip install -e '.[kube]' to check the manifests against Kubernetes' schemas")
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


CASES = [(mode, ps) for mode in protocol.MODES for ps in (1, 2, 3)]
EXTRA = {"backup": {"k": 2}, "ssp": {"staleness": 2}}


@pytest.mark.parametrize("mode,ps", CASES, ids=[f"{m}-ps{p}" for m, p in CASES])
def test_indexed_job_and_service_pass_kubernetes_schemas(mode, ps):
    docs = kube.manifests(
        image="registry.example.org/labs:1",
        ps=ps,
        workers=3,
        mode=mode,
        steps=100,
        env={"LABS_DATA_MIRROR": "https://mirror.example.org/data"},
        **EXTRA.get(mode, {}),
    )
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    for doc in docs:
        _k8s_valid(doc)
    config_map, service, job = docs
    # the pieces agree: the Service selects the Job's pods, which get the names in the cluster
    # file (<hostname>.<subdomain>), one pod per node, the PS tasks first
    pod = job["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    name = job["metadata"]["name"]
    cluster = json.loads(config_map["data"]["cluster.json"])
    assert len(cluster["ps"]) == ps and len(cluster["worker"]) == 3
    assert cluster["ps"] + cluster["worker"] == [
        f"{name}-{i}.{service['metadata']['name']}:{kube.PORT}" for i in range(ps + 3)
    ]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == ps + 3
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["backoffLimit"] == 0
    cfg = protocol.validate(
        protocol.RunConfig.from_dict(json.loads(config_map["data"]["config.json"]))
    )
    assert (cfg.mode, cfg.workers, cfg.run_id) == (mode, 3, name) and cfg.worker_timeout > 0
    (container,) = pod["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"config": kube.CONFIG_DIR, "runs": kube.RUNS_DIR}
    assert {"name": "LABS_DATA_MIRROR", "value": "https://mirror.example.org/data"} in container[
        "env"
    ]
    # the YAML an instructor applies holds the same objects
    assert list(yaml.safe_load_all(kube.to_yaml(docs))) == docs


@pytest.mark.parametrize("mode,ps", CASES, ids=[f"{m}-ps{p}" for m, p in CASES])
def test_tfjob_passes_its_crd_schema_and_kubernetes_pod_schemas(mode, ps, tfjob_schema):
    import jsonschema

    docs = kube.manifests(
        image="registry.example.org/labs:1",
        kind="tfjob",
        ps=ps,
        workers=2,
        mode=mode,
        steps=100,
        namespace="course",
        **({"k": 1} if mode == "backup" else EXTRA.get(mode, {})),
    )
    assert [d["kind"] for d in docs] == ["ConfigMap", "TFJob"]
    config_map, tfjob = docs
    _k8s_valid(config_map)
    jsonschema.validate(tfjob, tfjob_schema)
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) <= TF_REPLICA_TYPES
    assert (specs["PS"]["replicas"], specs["Worker"]["replicas"]) == (ps, 2)
    for spec in specs.values():
        template = spec["template"]
        # the pod template against Kubernetes' own PodTemplate schema, deeper than the CRD's
        _k8s_valid(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "check"},
                "template": template,
            }
        )
        names = [c["name"] for c in template["spec"]["containers"]]
        assert "tensorflow" in names  # where the operator sets TF_CONFIG
        assert all(c["image"] for c in template["spec"]["containers"])
    assert "cluster.json" not in config_map["data"]  # the operator's TF_CONFIG has the addresses


def test_a_typo_in_a_manifest_fails_the_checks(tfjob_schema):
    """The checks above can fail: an unknown field, a wrong type."""
    import jsonschema

    config_map, service, job = kube.manifests(image="labs:1", workers=2, mode="sync")
    job["spec"]["completionmode"] = "Indexed"
    with pytest.raises(getattr(kubernetes_validate, "ValidationError", Exception)):
        _k8s_valid(job)
    service["spec"]["ports"][0]["port"] = "2222"
    with pytest.raises(getattr(kubernetes_validate, "ValidationError", Exception)):
        _k8s_valid(service)
    _, tfjob = kube.manifests(image="labs:1", kind="tfjob", workers=2, mode="sync")
    tfjob["spec"]["runPolicy"]["cleanPodPolicies"] = "All"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(tfjob, tfjob_schema)


@pytest.mark.parametrize(
    "kwargs,named,remedy",
    [
        ({"name": "Run_1"}, "'Run_1'", "lower-case letters"),
        ({"name": "r" * 62}, "'r", "at most 63"),
        ({"image": ""}, "image ''", "give the container image"),
        ({"kind": "deployment"}, "'deployment'", "use 'job'"),
        ({"faults": {"1": {"kind": "kill", "at": 3}}}, "faults=", "use LocalCluster"),
        ({"worker_timeout": 0}, "worker_timeout=0", "e.g. worker_timeout=300"),
        ({"ps": 0}, "got 0", "ps must be an integer >= 1"),
        ({"mode": "bsp"}, "'bsp'", "use one of"),
        ({"workers": None}, "without workers", "give workers="),
        ({"stepz": 10}, "['stepz']", "fields of protocol.RunConfig"),
        ({"evaluator": True}, "evaluator=True", "no evaluator pod"),
        ({"deadline_s": 0}, "deadline_s must be", "got 0"),
        ({"kind": "tfjob", "name": "r" * 55, "workers": 12}, "'r", "at most 63"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs, named, remedy):
    args = {"image": "labs:1", "workers": 2, **kwargs}
    if args["workers"] is None:
        del args["workers"]
    with pytest.raises(ValueError) as err:
        kube.manifests(**args)
    assert named in str(err.value) and remedy in str(err.value)


def test_a_pod_reads_its_role_from_tf_config_or_its_index(tmp_path):
    tf_config = {
        "cluster": {"ps": ["r-ps-0.ns.svc:2222"], "worker": ["r-worker-0.ns.svc:2222", "w1:2222"]},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    cluster, job, task = kube.pod_role({"TF_CONFIG": json.dumps(tf_config)}, tmp_path)
    assert (cluster, job, task) == (tf_config["cluster"], "worker", 1)
    (tmp_path / "cluster.json").write_text(json.dumps({"ps": ["a:1", "b:1"], "worker": ["c:1"]}))
    got = [kube.pod_role({"JOB_COMPLETION_INDEX": str(i)}, tmp_path)[1:] for i in range(3)]
    assert got == [("ps", 0), ("ps", 1), ("worker", 0)]
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX=3, but the cluster file has 3"):
        kube.pod_role({"JOB_COMPLETION_INDEX": "3"}, tmp_path)
    chief = dict(tf_config, task={"type": "chief", "index": 0})
    chief["cluster"] = dict(tf_config["cluster"], chief=["c:2222"])
    with pytest.raises(ValueError, match="role 'chief'"):
        kube.pod_role({"TF_CONFIG": json.dumps(chief)}, tmp_path)
    with pytest.raises(ValueError, match="neither TF_CONFIG"):
        kube.pod_role({}, tmp_path)


@pytest.mark.slow
def test_the_job_pods_command_runs_the_run_for_real(tmp_path, shared_data):
    """Each pod of the Indexed Job, as a process: the manifest's command and environment, the
    ConfigMap's files as its mount, a shared runs folder. Only the pods' DNS names become
    localhost ports, in a private network namespace (TF's servers listen on every interface)."""
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    config_map, _, job = kube.manifests(
        image="labs:1", ps=2, workers=1, mode="sync", steps=40, lr=0.5, train_size=3000, name="k8s"
    )
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = tmp_path / "etc-labs"
    runs = tmp_path / "runs"
    mount.mkdir()
    cluster = json.loads(config_map["data"]["cluster.json"])
    names = cluster["ps"] + cluster["worker"]
    local = {a: f"127.0.0.1:{2222 + i}" for i, a in enumerate(names)}
    cluster = {job_: [local[a] for a in addrs] for job_, addrs in cluster.items()}
    (mount / "cluster.json").write_text(json.dumps(cluster))
    (mount / RunDir.CONFIG).write_text(config_map["data"][RunDir.CONFIG])
    argv = [
        {"python": sys.executable, kube.CONFIG_DIR: str(mount), kube.RUNS_DIR: str(runs)}.get(a, a)
        for a in container["command"]
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.update({e["name"]: e["value"] for e in container["env"]}, LABS_RUNS_DIR=str(runs))
    procs = []
    try:
        with netns.PrivateNetwork(isolate=True, what="The pods") as net:
            for index in range(job["spec"]["completions"]):
                with open(tmp_path / f"pod-{index}.log", "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            net.prefix + argv,
                            env=dict(env, JOB_COMPLETION_INDEX=str(index)),
                            stdout=subprocess.PIPE,
                            stderr=log,
                            start_new_session=True,
                        )
                    )
            outputs = [p.communicate(timeout=180)[0] for p in procs]
        tails = [log_tail(tmp_path / f"pod-{i}.log") for i in range(len(outputs))]
        assert [p.returncode for p in procs] == [0, 0, 0], tails
        ps0, ps1, worker = (json.loads(o.splitlines()[-1]) for o in outputs)
        assert ps1 == {"ps_task": 1} and worker["steps"] >= 40
        assert ps0["test_accuracy"] > 0.7
        ev = read_events(runs / "k8s")
        assert (ev.kind == "update").sum() == 40
        assert set(ev.source) == {"ps-0", "worker-0"}
        cfg, record = RunDir.read_config(runs / "k8s" / RunDir.CONFIG)  # the pods wrote it
        assert cfg.run_id == "k8s" and record.path == runs / "k8s"
    finally:
        for p in procs:  # by PID, whatever the test found
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            p.stdout.close()


def test_the_documented_command_writes_what_the_docs_say(capsys):
    """docs/cluster.md, 'On Kubernetes': the command as written, the names the page uses."""
    page = (HERE.parent / "docs" / "cluster.md").read_text()
    command = (
        "--image registry.example.org/labs:1 \\\n"
        "    --name sync-4w --ps 2 --workers 4 --mode sync --steps 500"
    )
    assert f"python -m helpers.cluster.kube manifests {command} > run.yaml" in page
    assert kube.main(["manifests", *command.replace("\\\n", "").split()]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    job = docs[-1]
    assert job["metadata"]["name"] == "sync-4w" and job["spec"]["completions"] == 6
    assert "job/sync-4w" in page and "sync-4w-i.sync-4w" in page and "/runs/sync-4w" in page
    for doc in docs:
        _k8s_valid(doc)


def test_the_command_line_refuses_a_field_given_twice_or_bad_json(capsys):
    base = ["manifests", "--image", "labs:1", "--workers", "2"]
    for extra, said in (
        (["--run", '{"steps": 10}'], "--run gives ['steps'] again: use the flag (--steps)"),
        (["--run", "k=3"], "--run 'k=3' is not JSON"),
    ):
        with pytest.raises(SystemExit):
            kube.main(base + extra)
        assert said in capsys.readouterr().err
    assert kube.main(base + ["--mode", "backup", "--run", '{"k": 1}']) == 0
    job = list(yaml.safe_load_all(capsys.readouterr().out))[-1]
    assert job["metadata"]["name"].startswith("labs-backup-")  # a new name for each run
