"""curate -> prepare -> train -> generate as one NeMo-Run experiment, on any executor.

    python launchers/experiment.py --workdir runs/demo --synthetic 4 --dryrun           # print every script
    python launchers/experiment.py --workdir runs/demo --synthetic 4                    # run on this machine
    python launchers/experiment.py --workdir /lustre/me/demo --raw /lustre/raw_videos --executor slurm \\
        -E account=proj -E partition=batch -E nodes=2 -E container_image=nvcr.io/... trainer.max_steps=1000
    python launchers/experiment.py --executor kubernetes -E image=ghcr.io/you/nemo-vfm -E pvcs='["data:/data"]' \\
        --workdir /data/demo --dryrun                                                     # prints the TrainJobs
    python launchers/experiment.py --status EXP_ID        # status of every step (nemo-run)
    python launchers/experiment.py --logs EXP_ID          # logs of every step (nemo-run)

Steps (``--steps``, in this order, each waits for the one before; Slurm gets ``afterok`` dependencies):
``synthesize`` (with ``--synthetic N``: N synthetic raw videos), ``curate`` (``curate_videos`` recipe ->
WORKDIR/curated/shards), ``prepare`` (``prepare_recipe`` -> WORKDIR/prepared), ``train`` (``--factory``
recipe on the prepared data, key=value overrides) and ``generate`` (``vfm generate`` from the trained
checkpoint -> WORKDIR/generated). Paths in WORKDIR must be visible to the executor's nodes.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

STEPS = ("synthesize", "curate", "prepare", "train", "generate")
PROMPTS = ("a red circle moving left on a black background", "a blue square moving up")


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _apply(recipe, overrides: list[str]):
    """``a.b.c=value`` overrides on a recipe (values parsed as JSON when they can be); the memory knobs they set stay
    as set under a memory budget (``recipes/cli.py``'s ``keep_memory_knobs``)."""
    from nemo_vfm_recipes.cli import keep_memory_knobs, memory_overrides

    for item in overrides:
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not KEY=VALUE (e.g. trainer.max_steps=10)")
        *path, last = key.split(".")
        node = recipe
        for part in path:
            node = getattr(node, part)
        if not hasattr(node, last):
            raise ValueError(f"override {key!r}: {type(node).__name__} has no field {last!r}")
        setattr(node, last, _value(val))
    return keep_memory_knobs(recipe, memory_overrides(overrides))


def build_tasks(workdir: str, *, steps=STEPS[1:], raw: str | None = None, synthetic: int = 0,
                factory: str = "quickstart", overrides: list[str] = (), curate_engine: str = "local",
                frames: int = 8, size: int = 32, generate_steps: int = 8) -> list[tuple[str, object]]:
    """``[(name, task), ...]``: NeMo-Run Partials (and a Script for ``vfm generate``), in chain order."""
    import nemo_run as run

    from nemo_vfm_recipes import dit

    work = Path(workdir).absolute()
    raw = str(Path(raw).absolute()) if raw else str(work / "raw")
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown step(s) {unknown}; choose from {', '.join(STEPS)}")
    if "synthesize" in steps and synthetic < 1:
        raise ValueError("the synthesize step needs --synthetic N (how many raw videos to make)")
    curated, prepared, exps = work / "curated", work / "prepared", work / "experiments"
    factories = {n: getattr(dit, n) for n in dir(dit) if n == "quickstart" or n.startswith("pretrain")}
    if factory not in factories:
        raise ValueError(f"unknown factory {factory!r}; choose one of: {', '.join(sorted(factories))}")
    recipe = factories[factory]()
    tasks = []
    for step in (s for s in STEPS if s in steps):
        if step == "synthesize":
            from nemo_vfm.curation.synthetic import make_raw_dataset

            tasks.append((step, run.Partial(make_raw_dataset, raw, num_videos=synthetic, seed=0, height=72,
                                            width=128, scene_s=(1.0, 2.0), scenes_per_video=(2, 3))))
        elif step == "curate":
            from nemo_vfm_recipes import curation

            task = curation.curate_videos(input_path=raw, output_path=str(curated))
            task.config.engine, task.config.height, task.config.min_clip_s = curate_engine, max(2 * size, 48), 0.5
            tasks.append((step, task))
        elif step == "prepare":
            from nemo_vfm_recipes import data

            m = recipe.model
            tasks.append((step, data.prepare_recipe(
                str(curated / "shards"), str(prepared), tokenizer_kwargs={"spatial_compression": 2},
                text_encoder_kwargs={"dim": m.context_dim or 64, "max_length": 12}, samples_per_shard=64,
                max_frames=frames, height=size, width=size, patch_multiple=tuple(m.patch_size), progress=False)))
        elif step == "train":
            if "prepare" in steps:
                from nemo_vfm_recipes import data

                recipe.data = data.energon_datamodule(str(prepared), micro_batch_size=4, num_workers=0,
                                                      patch_size=tuple(recipe.model.patch_size))
            recipe.log.root = str(exps)
            tasks.append((step, _apply(recipe, list(overrides))))
        elif step == "generate":
            ckpt = str(exps / recipe.log.name)
            args = ["generate", "--ckpt", ckpt, "--out", str(work / "generated"), "--steps", str(generate_steps),
                    "--device", "cpu" if recipe.trainer.accelerator == "cpu" else "cuda"]
            for p in PROMPTS:
                args += ["--prompt", p]
            # inline: written to a file and run by bash on every executor, so the prompts keep their spaces
            tasks.append((step, run.Script(inline=shlex.join(["python", "-m", "nemo_vfm.cli.main", *args]))))
    return tasks


def single_process(executor):
    """The executor for the one-process steps (synthesize, curate, generate): one node, one task."""
    import nemo_run as run

    from nemo_vfm_recipes import executors

    ex = executors.clone(executor)
    ex.launcher = None
    if isinstance(ex, run.SlurmExecutor):
        ex.nodes, ex.ntasks_per_node, ex.gpus_per_node = 1, 1, ex.gpus_per_node and 1
    elif isinstance(ex, run.LocalExecutor):
        ex.ntasks_per_node = 1
    elif isinstance(ex, run.KubeflowExecutor):
        ex.num_nodes, ex.nprocs_per_node, ex.gpus_per_node = 1, 1, ex.gpus_per_node and 1
    return ex


def for_pods(name: str, task, torchrun: bool = False):
    """Kubernetes pods do not see this machine's files: carry a Partial's serialized config in the command
    itself (``fdl_runner`` takes it inline) and run scripts as plain argument lists (no shell, no file).
    ``torchrun`` without arguments reads the PET_* rendezvous variables the Kubeflow Trainer sets."""
    import nemo_run as run
    from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

    if isinstance(task, run.Script):
        module, args = shlex.split(task.inline)[2], shlex.split(task.inline)[3:]
    else:
        module, args = "nemo_run.core.runners.fdl_runner", ["-n", name, ZlibJSONSerializer().serialize(task)]
    if torchrun:  # python -m torch.distributed.run == torchrun
        module, args = "torch.distributed.run", ["-m", module, *args]
    return run.Script(path=module, m=True, entrypoint="python", args=args)


def build_experiment(title: str, tasks, executor):
    """A ``run.Experiment`` with every task chained to the one before (``dependencies``)."""
    import nemo_run as run

    from nemo_vfm_recipes import executors

    exp = run.Experiment(title, log_level="WARN")
    exp.__enter__()
    previous = None
    for name, task in tasks:
        ex = executors.clone(executor) if name in ("prepare", "train") else single_process(executor)
        if isinstance(ex, run.KubeflowExecutor):
            task, ex.launcher = for_pods(name, task, torchrun=ex.launcher == "torchrun"), None
        previous = exp.add(task, executor=ex, name=name, dependencies=[previous] if previous else None)
    return exp


def print_dryrun(exp) -> list[str]:
    """Print (and return) every generated script: sbatch files, local commands, Kubernetes TrainJobs."""
    import yaml

    from nemo_vfm_recipes import executors

    out = []
    for job in exp.jobs:
        info = getattr(job, "_dryrun_info", None)
        if info is None:
            continue
        request = info.request
        if hasattr(request, "cmd") and hasattr(request, "executor") and hasattr(request.executor, "get_job_body"):
            name = f"vfm-{job.id}-{exp._id.rsplit('_', 1)[-1][-8:]}"
            text = yaml.safe_dump(executors.trainjob_manifest(request.executor, request.cmd, name), sort_keys=False)
        elif hasattr(request, "materialize"):
            text = request.materialize()
        else:
            text = str(info)
        out.append(text)
        print(f"# ---- step {job.id}: {type(job.executor).__name__} ----\n{text}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="train recipe overrides (trainer.max_steps=10)")
    p.add_argument("--workdir", default="runs/pipeline", help="where raw/, curated/, prepared/, experiments/ live")
    p.add_argument("--raw", help="raw videos folder (default WORKDIR/raw)")
    p.add_argument("--synthetic", type=int, default=0, metavar="N", help="first make N synthetic raw videos")
    p.add_argument("--steps", default=None, help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--factory", default="quickstart", help="training recipe factory")
    p.add_argument("--executor", default="local", choices=("local", "slurm", "kubernetes"))
    p.add_argument("-E", "--executor-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="executor argument (see nemo_vfm_recipes.executors), e.g. -E account=proj -E nodes=2")
    p.add_argument("--curate-engine", default="local", choices=("local", "ray"))
    p.add_argument("--title", default="vfm_pipeline", help="experiment title")
    p.add_argument("--dryrun", action="store_true", help="print every generated script/manifest; submit nothing")
    p.add_argument("--detach", action="store_true", help="submit and return (Slurm/Kubernetes)")
    p.add_argument("--status", metavar="EXP_ID", help="print the status of an experiment's steps")
    p.add_argument("--logs", metavar="EXP_ID", help="print the logs of an experiment's steps")
    args = p.parse_args(argv)

    import nemo_run as run

    from nemo_vfm_recipes import executors

    if args.status or args.logs:
        with run.Experiment.from_id(args.status or args.logs) as exp:
            exp.status() if args.status else [exp.logs(job.id) for job in exp.jobs]
        return 0
    try:
        kwargs = {}
        for item in args.executor_arg:
            key, sep, val = item.partition("=")
            if not sep:
                raise ValueError(f"executor argument {item!r} is not KEY=VALUE (e.g. -E account=proj)")
            kwargs[key.replace("-", "_")] = _value(val)
        import inspect

        builder = executors.BUILDERS[args.executor]
        allowed = inspect.signature(builder).parameters
        bad = sorted(set(kwargs) - set(allowed))
        if bad:
            raise ValueError(f"unknown {args.executor} executor argument(s) {bad}; choose from {', '.join(allowed)}")
        executor = builder(**kwargs)
        steps = args.steps.split(",") if args.steps else [s for s in STEPS if s != "synthesize" or args.synthetic]
        tasks = build_tasks(args.workdir, steps=steps, raw=args.raw, synthetic=args.synthetic, factory=args.factory,
                            overrides=args.overrides, curate_engine=args.curate_engine)
    except (ValueError, TypeError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with executors.deferred_kube_clients():  # Kubeflow executors read the kubeconfig when they submit
        return _launch(args, tasks, executor)


def _launch(args, tasks, executor) -> int:
    exp = build_experiment(args.title, tasks, executor)
    try:
        if args.dryrun:
            exp.dryrun(log=False)
            print_dryrun(exp)
            return 0
        exp.run(sequential=False, detach=args.detach)  # the chain is given as dependencies
    finally:
        exp.__exit__(None, None, None)  # waits for every step unless detached
    if not args.detach:
        states = {j.id: str(j.state).rsplit(".", 1)[-1].upper() for j in exp.jobs}
        failed = {name: state for name, state in states.items() if state != "SUCCEEDED"}
        if failed:
            print(f"error: step(s) {', '.join(f'{k} ({v})' for k, v in failed.items())} did not succeed; see "
                  f"`python launchers/experiment.py --logs {exp._id}`", file=sys.stderr)
            return 1
    print(f"experiment {exp._id}: status `python launchers/experiment.py --status {exp._id}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
