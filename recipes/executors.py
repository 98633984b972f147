"""Where a recipe runs: NeMo-Run executors for a laptop, a Slurm cluster and Kubernetes.

Python::

    import nemo_run as run
    from nemo_vfm_recipes.executors import local_executor, slurm_executor, kubernetes_executor
    run.run(recipe, executor=slurm_executor(account="proj", partition="batch", nodes=2, gpus_per_node=8,
                                            container_image="nvcr.io/nvidia/pytorch:25.09-py3",
                                            mounts=["/lustre/data:/data"], tunnel="ssh", host="login.example.com",
                                            user="me", job_dir="/lustre/me/nemo_run"))

CLI (``vfm train`` and ``launchers/train.py`` register these as ``local``, ``slurm`` and ``kubernetes``)::

    python launchers/train.py --factory pretrain_xl --yes run.executor=slurm run.executor.account=proj \\
        run.executor.partition=batch run.executor.nodes=2 run.executor.container_image=nvcr.io/...

Every argument is checked before anything is submitted: a wrong one raises ``ValueError`` naming the
argument and what to do. Kubernetes goes through nemo-run's ``KubeflowExecutor`` (a Kubeflow Trainer
``TrainJob``; docs/launching.md says why); :func:`trainjob_manifest` renders the exact manifest.
"""
# ruff: noqa: UP045  (Optional[X], not X | None: nemo-run 0.11's CLI parser rejects "X | None" arguments)

import contextlib
import re
import shutil
import subprocess
from typing import Optional

import nemo_run as run

_TIME = re.compile(r"^(\d+-)?(\d{1,2}:)?\d{1,2}:\d{2}$|^\d+$|^\d+-\d{1,2}$")
_MOUNT = re.compile(r"^/[^:]*:/[^:]*(:(ro|rw))?$")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_K8S_QUANTITY = re.compile(r"^\d+(\.\d+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def _int_at_least(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _env(env_vars) -> dict[str, str]:
    env = dict(env_vars or {})
    for k, v in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(k)):
            raise ValueError(f"env_vars key {k!r} is not a valid environment variable name")
        env[k] = str(v)
    return env


def local_executor(gpus_per_node: int = 1, *, launcher: Optional[str] = "torchrun", env_vars: Optional[dict] = None,
                   retries: int = 0) -> run.LocalExecutor:
    """This machine: ``gpus_per_node`` processes under ``torchrun`` (one process per GPU; 1 on a CPU).

    Set ``trainer.devices`` of the recipe to the same number (``recipe.trainer.devices = gpus_per_node``).
    """
    _int_at_least("local_executor gpus_per_node", gpus_per_node, 1)
    if launcher not in (None, "torchrun"):
        raise ValueError(f"local_executor launcher must be 'torchrun' or None, got {launcher!r}")
    return run.LocalExecutor(ntasks_per_node=gpus_per_node, launcher=launcher, env_vars=_env(env_vars),
                             retries=retries)


def slurm_executor(account: str, partition: Optional[str] = None, nodes: int = 1, gpus_per_node: Optional[int] = 8,
                   container_image: Optional[str] = None, mounts: Optional[list[str]] = None, time: str = "04:00:00", *,
                   tunnel: str = "local", host: Optional[str] = None, user: Optional[str] = None,
                   job_dir: Optional[str] = None, identity: Optional[str] = None, launcher: Optional[str] = "torchrun",
                   packager: str = "git", env_vars: Optional[dict] = None, setup_lines: Optional[str] = None,
                   cpus_per_task: Optional[int] = None, mem: Optional[str] = None, gres: Optional[str] = None,
                   exclusive: Optional[bool] = None, qos: Optional[str] = None, check_partition: bool = True,
                   retries: int = 0) -> run.SlurmExecutor:
    """A Slurm cluster: ``nodes`` x ``gpus_per_node`` ranks, ``srun`` + ``torchrun`` rendezvous.

    ``tunnel="local"`` submits with this machine's ``sbatch`` (you are on a login node; ``job_dir`` defaults
    to nemo-run's experiments folder); ``tunnel="ssh"`` submits through ``user@host`` and keeps the jobs in
    ``job_dir`` on the cluster. ``container_image`` (+ ``mounts`` ``"/host:/container[:ro]"``) runs in an
    enroot/pyxis container; without it the job runs on the node's own environment (``setup_lines`` can
    activate a venv). ``packager="git"`` ships the committed tree of this repo; ``"none"`` runs in place
    (shared filesystem). With ``check_partition`` and a local tunnel, ``partition`` is checked against
    ``sinfo`` before anything is submitted. ``gpus_per_node=None`` or ``0``: CPU nodes, one task per node.
    """
    if not isinstance(account, str) or not account.strip():
        raise ValueError("slurm_executor account must be your Slurm account name (sacctmgr show assoc user=$USER), "
                         f"got {account!r}")
    _int_at_least("slurm_executor nodes", nodes, 1)
    gpus = 0 if gpus_per_node is None else _int_at_least("slurm_executor gpus_per_node", gpus_per_node, 0)
    if not isinstance(time, str) or not _TIME.match(time):
        raise ValueError(f"slurm_executor time must be a Slurm time limit such as '04:00:00' or '1-00:00:00', got {time!r}")
    if tunnel not in ("local", "ssh"):
        raise ValueError(f"slurm_executor tunnel must be 'local' or 'ssh', got {tunnel!r}")
    if packager not in ("git", "none"):
        raise ValueError(f"slurm_executor packager must be 'git' or 'none', got {packager!r}")
    if launcher not in (None, "torchrun"):
        raise ValueError(f"slurm_executor launcher must be 'torchrun' or None, got {launcher!r}")
    if isinstance(mounts, str):
        raise ValueError(f"slurm_executor mounts must be a list of '/host:/container' strings, got the string {mounts!r}")
    mounts = list(mounts or [])
    for m in mounts:
        if not isinstance(m, str) or not _MOUNT.match(m):
            raise ValueError(f"slurm_executor mount {m!r} must look like '/host/path:/container/path[:ro]'")
    if mounts and not container_image:
        raise ValueError("slurm_executor mounts need a container_image (mounts are container mounts); "
                         "set container_image or drop the mounts")
    if container_image is not None and (not isinstance(container_image, str) or not container_image.strip()):
        raise ValueError(f"slurm_executor container_image must be an image name or a .sqsh path, got {container_image!r}")
    if tunnel == "ssh":
        missing = [n for n, v in (("host", host), ("user", user), ("job_dir", job_dir)) if not v]
        if missing:
            raise ValueError(f"slurm_executor tunnel='ssh' needs {', '.join(missing)} (the login node, your user "
                             "there and a folder on the cluster's shared filesystem for the jobs)")
        the_tunnel = run.SSHTunnel(host=host, user=user, job_dir=job_dir, identity=identity)
    else:
        if host or user or identity:
            raise ValueError("slurm_executor host/user/identity only apply to tunnel='ssh'; drop them or set tunnel='ssh'")
        the_tunnel = run.LocalTunnel(job_dir=job_dir or _experiments_dir())
        if check_partition and partition is not None:
            _check_partition(partition)
    return run.SlurmExecutor(
        account=account, partition=partition, nodes=nodes, ntasks_per_node=max(gpus, 1),
        gpus_per_node=gpus or None, cpus_per_task=cpus_per_task, mem=mem, gres=gres, exclusive=exclusive, qos=qos,
        time=time, container_image=container_image, container_mounts=mounts, tunnel=the_tunnel,
        packager=run.GitArchivePackager() if packager == "git" else run.Packager(),
        launcher=launcher, env_vars=_env(env_vars), setup_lines=setup_lines, retries=retries,
    )


def _experiments_dir() -> str:
    """nemo-run's experiments folder: a LocalTunnel's job_dir must equal it (nemo-run reads the jobs there)."""
    import os

    from nemo_run.config import get_nemorun_home

    return os.path.join(get_nemorun_home(), "experiments")


def slurm_partitions() -> list[str] | None:
    """Partition names this machine's Slurm knows (``sinfo``), or None when there is no ``sinfo``."""
    if not shutil.which("sinfo"):
        return None
    r = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30)
    return sorted(set(r.stdout.split())) if r.returncode == 0 else None


def _check_partition(partition: str) -> None:
    known = slurm_partitions()
    if known is not None and partition not in known:
        raise ValueError(f"slurm_executor partition {partition!r} is not a partition of this cluster; "
                         f"choose one of: {', '.join(known)}")


def kubernetes_executor(image: str, nodes: int = 1, gpus_per_node: Optional[int] = 8, *, namespace: str = "default",
                        nprocs_per_node: Optional[int] = None, cpu: Optional[str] = None, memory: Optional[str] = None,
                        pvcs: Optional[list[str]] = None, runtime: str = "torch-distributed",
                        env_vars: Optional[dict] = None, image_pull_secrets: Optional[list[str]] = None,
                        tolerations: Optional[list[dict]] = None, labels: Optional[dict] = None,
                        job_name: Optional[str] = None) -> run.KubeflowExecutor:
    """Kubernetes through the Kubeflow Trainer: one ``TrainJob`` of ``nodes`` pods, ``torchrun`` in each.

    ``image`` is required (the pods run it; it must have nemo-vfm installed, e.g. built with
    launchers/container/Dockerfile). ``pvcs`` are ``"claim-name:/mount/path"`` PersistentVolumeClaims for data and
    checkpoints. ``runtime`` names the ``ClusterTrainingRuntime`` (``torch-distributed`` ships with the
    Trainer). The kubeconfig is read when the job is submitted, not here, so manifests render offline.
    """
    if not isinstance(image, str) or not image.strip():
        raise ValueError("kubernetes_executor image is required: the container image the pods run "
                         "(with nemo-vfm installed), e.g. image='ghcr.io/you/nemo-vfm:latest'")
    _int_at_least("kubernetes_executor nodes", nodes, 1)
    gpus = None if gpus_per_node is None else _int_at_least("kubernetes_executor gpus_per_node", gpus_per_node, 0)
    if nprocs_per_node is not None:
        _int_at_least("kubernetes_executor nprocs_per_node", nprocs_per_node, 1)
    if not _K8S_NAME.match(namespace or ""):
        raise ValueError(f"kubernetes_executor namespace must be a DNS label (lowercase, digits, '-'), got {namespace!r}")
    if not _K8S_NAME.match(runtime or ""):
        raise ValueError(f"kubernetes_executor runtime must name a ClusterTrainingRuntime, got {runtime!r}")
    for name, q in (("cpu", cpu), ("memory", memory)):
        if q is not None and not _K8S_QUANTITY.match(str(q)):
            raise ValueError(f"kubernetes_executor {name} must be a Kubernetes quantity such as '8', '500m' or '64Gi', got {q!r}")
    if isinstance(pvcs, str):
        raise ValueError(f"kubernetes_executor pvcs must be a list of 'claim:/path' strings, got the string {pvcs!r}")
    volumes, mounts = [], []
    for i, spec in enumerate(pvcs or []):
        claim, sep, path = str(spec).partition(":")
        if not sep or not _K8S_NAME.match(claim) or not path.startswith("/"):
            raise ValueError(f"kubernetes_executor pvc {spec!r} must look like 'claim-name:/mount/path'")
        volumes.append({"name": f"vol{i}", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": f"vol{i}", "mountPath": path})
    for t in tolerations or []:
        if not isinstance(t, dict) or not ({"key", "operator"} & set(t)):
            raise ValueError(f"kubernetes_executor tolerations must be dicts like {{'key': 'nvidia.com/gpu', "
                             f"'operator': 'Exists', 'effect': 'NoSchedule'}}, got {t!r}")
    if job_name is not None and not _K8S_NAME.match(job_name):
        raise ValueError(f"kubernetes_executor job_name must be a DNS label, got {job_name!r}")
    kwargs = dict(
        image=image, num_nodes=nodes, gpus_per_node=gpus or None, nprocs_per_node=nprocs_per_node or (gpus or 1),
        namespace=namespace, runtime_ref=runtime, cpu_requests=_str(cpu), cpu_limits=_str(cpu),
        memory_requests=_str(memory), memory_limits=_str(memory), volumes=volumes, volume_mounts=mounts, env_vars=_env(env_vars),
        image_pull_secrets=list(image_pull_secrets or []), tolerations=[dict(t) for t in tolerations or []],
        labels=dict(labels or {}), train_job_basename=job_name, launcher="torchrun",
    )
    return _kubeflow_executor(**kwargs)


@contextlib.contextmanager
def deferred_kube_clients():
    """While active, ``KubeflowExecutor``s are built without reading a kubeconfig. nemo-run (re)loads its API
    clients lazily on first use anyway, so submitting still reads it, while building executors, cloning them
    (``exp.add`` does) and rendering manifests work offline."""
    from nemo_run.core.execution import kubeflow

    load = kubeflow.KubeflowExecutor._load_kube_clients
    kubeflow.KubeflowExecutor._load_kube_clients = lambda self: None
    try:
        yield kubeflow.KubeflowExecutor
    finally:
        kubeflow.KubeflowExecutor._load_kube_clients = load


def _str(q):
    return None if q is None else str(q)


def _kubeflow_executor(**kwargs) -> run.KubeflowExecutor:
    from nemo_run.core.execution import kubeflow

    if not kubeflow._KUBERNETES_AVAILABLE:
        raise ImportError("the Kubernetes executor needs the kubernetes client: pip install kubernetes")
    with deferred_kube_clients() as cls:
        return cls(**kwargs)


def clone(executor: run.Executor) -> run.Executor:
    """A copy of ``executor`` (``Executor.clone`` rebuilds it, which for Kubeflow would read a kubeconfig)."""
    with deferred_kube_clients():
        return executor.clone()


def trainjob_manifest(executor: run.KubeflowExecutor, command: list[str], name: Optional[str] = None) -> dict:
    """The ``TrainJob`` that ``executor`` submits for ``command`` (the exact body sent to the API server)."""
    name = name or executor._trainjob_name(getattr(executor, "job_name", None) or "nemo-vfm")
    return executor.get_job_body(name, list(command))


# -- CLI registration: ``run.executor=local|slurm|kubernetes`` plus ``run.executor.ARG=VALUE`` -------------
# Each factory returns a Config of the builder above, so CLI overrides pass through its validation.
@run.cli.factory(name="local")
def local() -> run.Config[run.LocalExecutor]:
    """``run.executor=local run.executor.gpus_per_node=8``"""
    return run.Config(local_executor)


@run.cli.factory(name="slurm")
def slurm() -> run.Config[run.SlurmExecutor]:
    """``run.executor=slurm run.executor.account=A run.executor.partition=P run.executor.nodes=N ...``"""
    return run.Config(slurm_executor, account="")


@run.cli.factory(name="kubernetes")
def kubernetes() -> run.Config[run.Executor]:
    """``run.executor=kubernetes run.executor.image=IMAGE run.executor.nodes=N ...`` (a Kubeflow TrainJob)"""
    return run.Config(kubernetes_executor, image="")

BUILDERS = {"local": local_executor, "slurm": slurm_executor, "kubernetes": kubernetes_executor}
