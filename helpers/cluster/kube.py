"""One engine run on Kubernetes: the manifests, and the command each pod runs.

    python -m helpers.cluster.kube manifests --image registry/labs:1 --ps 2 --workers 4 \\
        --mode sync --steps 500 > run.yaml          # an Indexed Job and a headless Service
    python -m helpers.cluster.kube manifests --kind tfjob ...        # Kubeflow's TFJob instead
    kubectl apply -f run.yaml

Kubernetes has no launcher process watching the nodes, so the run goes as the standalone nodes
of helpers/cluster/README.md ("On real machines") go: every pod runs one node with `--run`, the
PS gives up after `worker_timeout` seconds without a message from any worker, and each node
writes its event log into the run's folder on a volume every pod mounts (a PersistentVolumeClaim
that can be mounted read-write by many pods at once). `RunDir(<that folder>).events()` or
`Run` reads it back as it does a local run.

Two ways to give each pod its role:
- **Indexed Job + headless Service** (no operator needed): pod i of the Job is PS task i for
  i < ps, else worker i - ps. The Service gives pod i the DNS name `<name>-<i>.<name>`, so the
  cluster file in the ConfigMap lists those names.
- **TFJob** (Kubeflow's training operator, `kubeflow.org/v1`): the operator starts the PS and
  Worker replicas and sets TF_CONFIG in each pod; the pod reads its role and the addresses there.

Not run here: there is no Kubernetes cluster on the machines this is developed and tested on.
CI validates the manifests against Kubernetes' own schemas (kubernetes-validate) and the TFJob
against its CRD's schema (tests/data/), and runs each pod's command for real on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from helpers.cluster import protocol
from helpers.cluster.rundir import RunDir

PORT = 2222  # TFJob's default port; every pod has its own address, so one port serves all
CONFIG_DIR = "/etc/labs"  # the ConfigMap: cluster.json (Indexed Job only) and config.json
RUNS_DIR = "/runs"  # the shared volume with the runs' folders
KINDS = ("job", "tfjob")
APP = "scaling-ml-labs"
# a DNS-1035 label (RFC 1035): what Services, and TFJob's webhook, accept as a name
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def roles(ps: int, workers: int) -> list[tuple[str, int]]:
    """The Indexed Job's pod index -> (job, task): the PS tasks first, then the workers."""
    return [("ps", t) for t in range(ps)] + [("worker", t) for t in range(workers)]


def _check(name: str, image: str, ps: int, cfg: protocol.RunConfig, kind: str) -> None:
    # a pod's host name must itself be a DNS label of at most 63 characters: "<name>-<i>" in an
    # Indexed Job, "<name>-worker-<i>" and "<name>-ps-<i>" under the TFJob operator
    if kind == "job":
        longest = f"{name}-{ps + cfg.workers - 1}"
    else:
        longest = max(f"{name}-worker-{cfg.workers - 1}", f"{name}-ps-{ps - 1}", key=len)
    if not _NAME.match(name or "") or len(longest) > 63:
        raise ValueError(
            f"run name {name!r} cannot name Kubernetes objects: use lower-case letters, digits "
            f"and '-', starting with a letter, short enough that {longest!r} has at most 63 "
            f"characters"
        )
    if not image or any(c.isspace() for c in image):
        raise ValueError(
            f"image {image!r}: give the container image that holds this repository and its "
            f"environment (docs/cluster.md, 'On Kubernetes'), e.g. registry.example.org/labs:1"
        )
    if ps < 1 or isinstance(ps, bool):
        raise ValueError(f"ps must be an integer >= 1, got {ps!r}")
    if cfg.faults:
        raise ValueError(
            f"faults={cfg.faults!r}: a pod that kills itself fails the Job (its backoffLimit is 0, "
            f"since a run cannot take a restarted node back); use LocalCluster to inject faults"
        )
    if cfg.worker_timeout <= 0:
        raise ValueError(
            f"worker_timeout={cfg.worker_timeout!r}: on Kubernetes no launcher watches the "
            f"workers, so the PS needs a limit (seconds without a message from any worker) to "
            f"end a run whose worker died; e.g. worker_timeout=300"
        )
    if cfg.evaluator:
        raise ValueError(
            "evaluator=True: the manifests start no evaluator pod; evaluate the run's "
            "checkpoints afterwards (checkpoint_every=...) from the runs volume"
        )


def _container(name: str, image: str, env: dict, cpu: str, memory: str) -> dict:
    return {
        "name": name,
        "image": image,
        "command": pod_command(),
        "env": [{"name": "LABS_RUNS_DIR", "value": RUNS_DIR}]
        + [{"name": k, "value": str(v)} for k, v in sorted(env.items())],
        "ports": [{"containerPort": PORT, "name": "tfjob-port", "protocol": "TCP"}],
        # a TF process takes ~700 MB; a worker computes on one core
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "runs", "mountPath": RUNS_DIR},
        ],
    }


def _volumes(name: str, runs_claim: str) -> list[dict]:
    return [
        {"name": "config", "configMap": {"name": name}},
        {"name": "runs", "persistentVolumeClaim": {"claimName": runs_claim}},
    ]


def pod_command() -> list[str]:
    """What every pod runs (the image's working directory is the repository)."""
    return [
        "python",
        "-m",
        "helpers.cluster.kube",
        "pod",
        "--config",
        CONFIG_DIR,
        "--runs",
        RUNS_DIR,
    ]


def manifests(
    *,
    image: str,
    ps: int = 1,
    kind: str = "job",
    name: str | None = None,
    namespace: str | None = None,
    runs_claim: str = "labs-runs",
    env: dict | None = None,
    cpu: str = "1",
    memory: str = "2Gi",
    deadline_s: int = 3600,
    **run,
) -> list[dict]:
    """The objects that run one engine run on Kubernetes, in the order to apply them.

    Args:
        image: a container image with this repository as its working directory and its
            packages installed (docs/cluster.md, 'On Kubernetes').
        ps: PS tasks (the parameters are sharded over them as on LocalCluster).
        kind: "job" (an Indexed Job and a headless Service) or "tfjob" (Kubeflow's TFJob).
        name: the run's id and the objects' name (a DNS label); by default the mode and
            the time, so that every call names a new run.
        runs_claim: a PersistentVolumeClaim every pod can mount read-write (ReadWriteMany):
            the runs' folders, with every node's event log.
        env: more environment variables for every pod (LABS_DATA_MIRROR, for example).
        cpu, memory: what each pod requests (a TF process needs about 700 MB).
        deadline_s: the Job ends, and its pods with it, after this many seconds at most.
        **run: the fields of protocol.RunConfig (workers, mode, steps, worker_timeout, ...).
            worker_timeout defaults to 300 s here; it counts from the PS's start, so it must
            also cover the other pods being scheduled, their image pulled, their data read.
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use 'job' (Indexed Job + Service) or 'tfjob' (Kubeflow)")
    unknown = sorted(set(run) - {f.name for f in dataclasses.fields(protocol.RunConfig)})
    if unknown or "workers" not in run:
        raise ValueError(
            f"run fields {unknown or 'without workers'}: give workers= (the worker pods) and "
            f"other fields of protocol.RunConfig (mode, steps, lr, ...)"
        )
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int) or deadline_s < 1:
        raise ValueError(f"deadline_s must be a whole number of seconds >= 1, got {deadline_s!r}")
    run.setdefault("worker_timeout", 300.0)
    run.setdefault("worker_ids", list(range(run["workers"])))
    # a new name for each run by default: an applied Job of the same name would be left as it
    # is, and a finished run's folder would get the new run's events appended to its own
    name = name or f"labs-{run.get('mode', 'async')}-{time.strftime('%m%d-%H%M%S')}"
    cfg = protocol.validate(protocol.RunConfig(run_id=name, **run))
    _check(name, image, ps, cfg, kind)
    meta = {"name": name, "labels": {"app.kubernetes.io/name": APP, f"{APP}/run": name}}
    if namespace:
        meta["namespace"] = namespace
    data = {RunDir.CONFIG: json.dumps(cfg.to_dict(), indent=1)}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
    pod = {"restartPolicy": "Never", "volumes": _volumes(name, runs_claim)}
    template = {"metadata": {"labels": dict(meta["labels"])}, "spec": pod}
    limits = {"activeDeadlineSeconds": deadline_s, "ttlSecondsAfterFinished": 3600}
    if kind == "tfjob":
        # the operator finds the container named "tensorflow" and sets its TF_CONFIG there
        pod["containers"] = [_container("tensorflow", image, env or {}, cpu, memory)]
        return [config_map, _tfjob(meta, template, limits, ps, cfg.workers)]
    pod["containers"] = [_container("node", image, env or {}, cpu, memory)]
    hosts = [f"{name}-{i}.{name}:{PORT}" for i in range(ps + cfg.workers)]
    data["cluster.json"] = json.dumps({"ps": hosts[:ps], "worker": hosts[ps:]}, indent=1)
    return [config_map, *_indexed_job(meta, template, limits, ps + cfg.workers)]


def _tfjob(meta: dict, template: dict, limits: dict, ps: int, workers: int) -> dict:
    replica = {"restartPolicy": "Never", "template": template}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": meta,
        "spec": {
            "runPolicy": {"cleanPodPolicy": "All", "backoffLimit": 0, **limits},
            "tfReplicaSpecs": {
                "PS": {"replicas": ps, **replica},
                "Worker": {"replicas": workers, **replica},
            },
        },
    }


def _indexed_job(meta: dict, template: dict, limits: dict, nodes: int) -> list[dict]:
    """A headless Service and an Indexed Job of `nodes` pods, pod i named <name>-i.<name>."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",  # headless: a DNS name per pod, no load balancing
            # a worker may look up the PS before the PS is ready (TF retries the connection)
            "publishNotReadyAddresses": True,
            "selector": dict(meta["labels"]),
            "ports": [{"name": "tfjob-port", "port": PORT, "targetPort": PORT}],
        },
    }
    template["spec"]["subdomain"] = meta["name"]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completionMode": "Indexed",  # JOB_COMPLETION_INDEX in every pod: its role
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,  # a node that fails ends the run: no restarted node can rejoin
            **limits,
            "template": template,
        },
    }
    return [service, job]


def to_yaml(docs: list[dict]) -> str:
    """The objects as one YAML stream for `kubectl apply -f`: the files in the ConfigMap as
    literal blocks, every object written out in full (no YAML anchors)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    def text(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return "---\n".join(yaml.dump(d, Dumper=Dumper, sort_keys=False) for d in docs)


# ----------------------------------------------------------------------------- in the pod
def pod_role(environ, config_dir: Path) -> tuple[dict, str, int]:
    """(the cluster's addresses, job, task) of this pod: from TF_CONFIG (TFJob) or from
    JOB_COMPLETION_INDEX and the ConfigMap's cluster.json (Indexed Job)."""
    if environ.get("TF_CONFIG"):
        tf_config = json.loads(environ["TF_CONFIG"])
        cluster = {k: v for k, v in tf_config["cluster"].items() if k in ("ps", "worker")}
        job, task = tf_config["task"]["type"].lower(), int(tf_config["task"]["index"])
        if job not in cluster:
            raise ValueError(
                f"TF_CONFIG gives this pod the role {job!r}: the engine has 'ps' and 'worker' "
                f"replicas only (tfReplicaSpecs PS and Worker)"
            )
        return cluster, job, task
    if "JOB_COMPLETION_INDEX" in environ:
        cluster = json.loads((Path(config_dir) / "cluster.json").read_text())
        cluster.pop("schema", None)
        index = int(environ["JOB_COMPLETION_INDEX"])
        table = roles(len(cluster["ps"]), len(cluster["worker"]))
        if not 0 <= index < len(table):
            raise ValueError(
                f"JOB_COMPLETION_INDEX={index}, but the cluster file has {len(table)} nodes: the "
                f"Job's completions and the ConfigMap come from different runs"
            )
        job, task = table[index]
        return cluster, job, task
    raise ValueError(
        "neither TF_CONFIG (a TFJob's pod) nor JOB_COMPLETION_INDEX (an Indexed Job's pod) is "
        "set: this command runs inside a pod of the manifests `python -m helpers.cluster.kube "
        "manifests` writes"
    )


def pod_main(config_dir: Path, runs: Path, environ=os.environ) -> int:
    """Run this pod's node of the run: its role, then node.py's standalone run."""
    from helpers.cluster import node
    from helpers.cluster.rundir import write_cluster

    cluster, job, task = pod_role(environ, config_dir)
    cfg, _ = RunDir.read_config(Path(config_dir) / RunDir.CONFIG)
    record = RunDir(Path(runs) / cfg.run_id)
    config_file = record.write_config(cfg)  # every pod writes the same bytes, atomically
    with tempfile.TemporaryDirectory() as tmp:
        cluster_file = write_cluster(Path(tmp) / "cluster.json", cluster)
        argv = ["--cluster", str(cluster_file), "--job", job, "--task", str(task)]
        code = node.main([*argv, "--run", str(config_file)])
    if job == "worker" and code == 0:
        # a worker ends once the run has: the TFJob operator counts a run without a chief as
        # done when worker 0 exits, and would then delete PS task 0 before its final record
        node.wait_until_closed(cluster["ps"][0], f"worker {task}")
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("manifests", help="print the manifests of one run as YAML")
    m.add_argument("--image", required=True)
    m.add_argument("--kind", choices=KINDS, default="job")
    m.add_argument("--name")
    m.add_argument("--namespace")
    m.add_argument("--runs-claim", default="labs-runs")
    m.add_argument("--ps", type=int, default=1)
    m.add_argument("--workers", type=int, required=True)
    m.add_argument("--mode", default="async", choices=protocol.MODES)
    m.add_argument("--steps", type=int, default=500)
    m.add_argument("--model", default="logreg")
    m.add_argument("--worker-timeout", type=float, default=300.0)
    m.add_argument("--run", default="{}", help="more RunConfig fields as JSON, e.g. '{\"k\": 3}'")
    pod = sub.add_parser("pod", help="inside a pod: run its node")
    pod.add_argument("--config", default=CONFIG_DIR)
    pod.add_argument("--runs", default=RUNS_DIR)
    args = p.parse_args(argv)
    if args.what == "pod":
        return pod_main(Path(args.config), Path(args.runs))
    try:
        more = json.loads(args.run)
    except json.JSONDecodeError as err:
        p.error(f"--run {args.run!r} is not JSON ({err}); e.g. --run '{{\"k\": 3}}'")
    run = dict(
        workers=args.workers,
        mode=args.mode,
        steps=args.steps,
        model=args.model,
        worker_timeout=args.worker_timeout,
    )
    twice = sorted(set(more) & set(run))
    if twice:
        p.error(f"--run gives {twice} again: use the flag (--{twice[0].replace('_', '-')})")
    docs = manifests(
        image=args.image,
        ps=args.ps,
        kind=args.kind,
        name=args.name,
        namespace=args.namespace,
        runs_claim=args.runs_claim,
        **run,
        **more,
    )
    sys.stdout.write(to_yaml(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
