"""Kubernetes: the TrainJobs that `launchers/experiment.py --executor kubernetes --dryrun` prints.

Checked offline against schemas: the TrainJob against the Kubeflow Trainer v2.1 API models
(``kubeflow-trainer-api``, generated from the Trainer's OpenAPI spec: a round trip must keep every field,
so an unknown or misspelt field fails), and every embedded core object (ObjectMeta, ResourceRequirements,
EnvVar, Volume, VolumeMount, Toleration) against the Kubernetes 1.33 JSON schemas shipped by
``kubernetes-validate`` (strict: no additional properties). Golden files pin the exact manifests.
"""

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kubernetes", reason="the Kubernetes executor needs the kubernetes client (pip install kubernetes)")
pytest.importorskip("kubeflow_trainer_api", reason="TrainJob schema: pip install kubeflow-trainer-api==2.1.0")
pytest.importorskip("kubernetes_validate", reason="Kubernetes JSON schemas: pip install kubernetes-validate")

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = "1.33.0"


def _load(name):
    sys.path.insert(0, str(ROOT / "launchers"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "launchers" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    """The dryrun of the full chain on 2 nodes x 8 GPUs with a data PVC: {step: (manifest, printed text)}."""
    from nemo_run import config

    old_home = config.get_nemorun_home()
    config.set_nemorun_home(str(tmp_path_factory.mktemp("nemorun")))
    experiment = _load("experiment")
    executors = importlib.import_module("nemo_vfm_recipes.executors")
    ex = executors.kubernetes_executor("ghcr.io/example/nemo-vfm:0.1", nodes=2, gpus_per_node=8, cpu="32",
                                       memory="512Gi", pvcs=["vfm-data:/data"], env_vars={"HF_HOME": "/data/hf"},
                                       tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists",
                                                     "effect": "NoSchedule"}])
    tasks = experiment.build_tasks("/data/demo", steps=experiment.STEPS, raw="/data/raw", synthetic=4,
                                   factory="pretrain_xl", overrides=["trainer.max_steps=100"])
    with executors.deferred_kube_clients():
        exp = experiment.build_experiment("vfm_pipeline", tasks, ex)
        try:
            exp.dryrun(log=False)
            texts = experiment.print_dryrun(exp)
        finally:
            exp.__exit__(None, None, None)
            config.set_nemorun_home(old_home)
    return {job.id: (yaml.safe_load(t), t) for job, t in zip(exp.jobs, texts)}


def _normalized(text: str) -> str:
    text = re.sub(r"(name: vfm-[a-z]+-)\d+", r"\1EXPID", text)
    return re.sub(r"^(    - )eJ[\w-]+=*$", r"\1<serialized task config>", text, flags=re.M)


@pytest.mark.parametrize("step", ["synthesize", "curate", "prepare", "train", "generate"])
def test_manifest_matches_golden(manifests, step):
    _, text = manifests[step]
    golden = GOLDEN / f"k8s_{step}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(_normalized(text))
    assert _normalized(text) == golden.read_text()


def _core(kind: str, obj: dict):
    import kubernetes_validate

    schema = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/{kind}.json", K8S_VERSION)
    defs = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/_definitions.json", K8S_VERSION)
    import jsonschema
    from referencing import Registry, Resource

    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    jsonschema.Draft202012Validator(schema, registry=registry).validate(obj)


def validate_trainjob(manifest: dict) -> None:
    """Raise if ``manifest`` is not a valid Kubeflow Trainer v2.1 TrainJob with valid core objects."""
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    job = TrainerV1alpha1TrainJob.from_dict(manifest)
    assert job.to_dict() == manifest, "fields the TrainJob schema does not know were dropped"
    _core("objectmeta-meta-v1", manifest["metadata"])
    trainer = manifest["spec"]["trainer"]
    assert all(isinstance(a, str) for a in trainer["command"])
    if "resourcesPerNode" in trainer:
        _core("resourcerequirements-v1", trainer["resourcesPerNode"])
    for env in trainer.get("env", []):
        _core("envvar-v1", env)
    for override in manifest["spec"].get("podTemplateOverrides", []):
        spec = override.get("spec", {})
        for v in spec.get("volumes", []):
            _core("volume-v1", v)
        for t in spec.get("tolerations", []):
            _core("toleration-v1", t)
        for c in spec.get("containers", []):
            for m in c.get("volumeMounts", []):
                _core("volumemount-v1", m)


def test_manifests_are_valid_trainjobs(manifests):
    for step, (manifest, _) in manifests.items():
        validate_trainjob(manifest)
        trainer = manifest["spec"]["trainer"]
        multi = step in ("prepare", "train")
        assert (trainer["numNodes"], trainer["numProcPerNode"]) == ((2, 8) if multi else (1, 1)), step
        assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == ("8" if multi else "1")
        assert trainer["command"][:3] == ["python", "-m", "torch.distributed.run" if multi else trainer["command"][2]]


def test_validation_catches_broken_manifests(manifests):
    import jsonschema

    manifest = json.loads(json.dumps(manifests["train"][0]))
    manifest["spec"]["trainer"]["numNodez"] = 2
    with pytest.raises(AssertionError, match="does not know"):
        validate_trainjob(manifest)
    manifest = json.loads(json.dumps(manifests["train"][0]))
    manifest["spec"]["podTemplateOverrides"][0]["spec"]["volumes"][0]["persistentVolumeClaim"] = {"claim": "x"}
    with pytest.raises((AssertionError, ValueError, jsonschema.ValidationError)):
        validate_trainjob(manifest)
    with pytest.raises(jsonschema.ValidationError, match="claimName"):  # the core schema on its own
        _core("volume-v1", {"name": "v", "persistentVolumeClaim": {"claim": "x"}})
    with pytest.raises(jsonschema.ValidationError):
        _core("resourcerequirements-v1", {"limits": {"cpu": ["8"]}})


def test_train_config_travels_inline_and_rebuilds(manifests):
    """The pods get the train recipe inside the command (they cannot read this machine's files)."""
    import fiddle as fdl
    from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

    cmd = manifests["train"][0]["spec"]["trainer"]["command"]
    assert cmd[3:7] == ["-m", "nemo_run.core.runners.fdl_runner", "-n", "train"]
    task = ZlibJSONSerializer().deserialize(cmd[7])
    assert task.trainer.max_steps == 100 and task.model.hidden_size == 1152
    assert task.data.path == "/data/demo/prepared" and task.log.root == "/data/demo/experiments"
    assert isinstance(task, fdl.Partial)
    gen = manifests["generate"][0]["spec"]["trainer"]["command"]
    assert "a red circle moving left on a black background" in gen  # one argument, spaces kept


def test_kubernetes_executor_needs_an_image_and_checks_arguments():
    executors = importlib.import_module("nemo_vfm_recipes.executors")
    with pytest.raises(ValueError, match="image is required"):
        executors.kubernetes_executor("")
    with pytest.raises(ValueError, match="claim-name:/mount/path"):
        executors.kubernetes_executor("img", pvcs=["data"])
    with pytest.raises(ValueError, match="quantity"):
        executors.kubernetes_executor("img", memory="lots")
    with pytest.raises(ValueError, match="namespace"):
        executors.kubernetes_executor("img", namespace="My_NS")
