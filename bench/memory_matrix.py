"""Memory x speed matrix of the fine-tuning recipes (issue 27): each case runs the recipe's ``train()`` with
``trainer.memory_budget_gb=N`` on one GPU whose usable memory is capped at N GiB with
``torch.cuda.set_per_process_memory_fraction`` (an emulated card size, said so in the JSON), random weights
(``model.pretrained=None``: weights do not change memory or speed) and random latents of the case's clip size.

    # the matrix of docs/finetuning.md (one H100): Wan 1.3B / 14B, LoRA / full, 480p / 720p x 81 frames
    python bench/memory_matrix.py --budgets 24,32,48,80 --out bench/results/memory_matrix_h100.json
    python bench/memory_matrix.py --only wan14b-lora-480p --budgets 24 --out /tmp/m.json
    # one table and plot from several runs (e.g. one GPU per case on a 4-GPU machine)
    python bench/memory_matrix.py --merge bench/results/memory_matrix_wan*_4xh100_bde64a9.json --out /tmp/all.json
    # CPU smoke run (what tests/bench does): no cap on the CPU, the chooser still runs
    python bench/memory_matrix.py --device cpu --case tiny=quickstart:2x8x8 --budgets 4 --steps 2 \\
        --set model.num_layers=2 --set model.hidden_size=64 --out /tmp/m.json

Per case and budget, one child process (so that a cap or an out-of-memory error stays in it) records: whether it
fits (exit 0), the chooser's line (``memory budget N GiB: ...``), s/step (median of the logged intervals after the
first) and peak GiB from the run's ``perf.jsonl``, or the reason it did not run (out of memory, nothing fits). A
JSON (device, date, commit, command), a Markdown table and a PNG of s/step against the budget are written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import (  # noqa: E402
    ROOT,
    bookkeeping,
    environment,
    load_recipe,
    perf_rows,
    pyplot,
    read_perf,
    save_figure,
    write_json,
)

FRAMES_81 = 21  # latent frames of 81 video frames (4x temporal compression + 1)
CASES = {  # name -> (factory, latent (T, H, W), overrides)
    "wan1.3b-lora-480p": ("lora_wan_1_3b", (FRAMES_81, 60, 104), []),
    "wan1.3b-lora-720p": ("lora_wan_1_3b", (FRAMES_81, 90, 160), []),
    "wan14b-lora-480p": ("lora_wan_14b", (FRAMES_81, 60, 104), []),
    "wan14b-lora-720p": ("lora_wan_14b", (FRAMES_81, 90, 160), []),
    "wan1.3b-full-480p": ("finetune_wan_1_3b", (FRAMES_81, 60, 104), []),
    "wan14b-full-480p": ("finetune_wan_14b", (FRAMES_81, 60, 104), ["trainer.strategy.context_parallel_size=1"]),
    "wan1.3b-full-720p": ("finetune_wan_1_3b", (FRAMES_81, 90, 160), []),
    "wan14b-full-720p": ("finetune_wan_14b", (FRAMES_81, 90, 160), ["trainer.strategy.context_parallel_size=1"]),
    # Wan 2.2: TI2V-5B at its 704 x 1280 x 121 frames (48-channel latents, 16x spatial: 27,280 tokens); one expert of
    # T2V-A14B (the 14B architecture) at 480p / 720p x 81 frames
    "wan2.2-5b-lora-704p": ("lora_wan2_2_ti2v_5b", (31, 44, 80), []),
    "wan2.2-5b-full-704p": ("finetune_wan2_2_ti2v_5b", (31, 44, 80), []),
    "wan2.2-a14b-lora-480p": ("lora_wan2_2_t2v_a14b", (FRAMES_81, 60, 104), []),
    "wan2.2-a14b-lora-720p": ("lora_wan2_2_t2v_a14b", (FRAMES_81, 90, 160), []),
    "wan2.2-a14b-full-480p": ("finetune_wan2_2_t2v_a14b", (FRAMES_81, 60, 104),
                              ["trainer.strategy.context_parallel_size=1"]),
}
LOG_TAIL = 30


def parse_case(spec: str) -> tuple[str, tuple]:
    """``name=factory:TxHxW`` -> (name, (factory, (T, H, W), []))."""
    name, _, rest = spec.partition("=")
    factory, _, shape = rest.partition(":")
    try:
        latent = tuple(int(v) for v in shape.lower().split("x"))
    except ValueError:
        latent = ()
    if not name or not factory or len(latent) != 3:
        raise ValueError(f"--case takes name=factory:TxHxW (e.g. tiny=quickstart:2x8x8), got {spec!r}")
    return name, (factory, latent, [])


def case_recipe(spec: dict):
    """The case's recipe (a Fiddle config of ``train``): its factory, ``spec["overrides"]``, random weights, random
    latents of the case's clip size."""
    import fiddle as fdl

    from nemo_vfm.data.synthetic import MockLatentDataModule

    recipe = load_recipe(spec["factory"], spec["overrides"])
    if hasattr(recipe.model, "pretrained"):
        recipe.model.pretrained = None
    m = recipe.model
    t, h, w = spec["latent"]
    recipe.data = fdl.Config(MockLatentDataModule, latent_channels=getattr(m, "out_channels", None) or m.in_channels,
                             num_frames=t, height=h, width=w, context_dim=getattr(m, "context_dim", None),
                             context_length=getattr(m, "text_len", 16), batch_size=1, num_samples=4, num_workers=0)
    return recipe


def run_child(spec: dict) -> None:
    """In the child: cap the GPU memory, build the case's recipe, train."""
    import fiddle as fdl
    import torch

    if spec["device"] == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["budget"] / total))
    fdl.build(case_recipe(spec))()


def plan_case(name: str, case: tuple, budget: float, args) -> dict:
    """What ``trainer.memory_budget_gb=budget`` would choose for a GPU run of the case (nothing is run; estimates)."""
    import inspect

    import fiddle as fdl

    from nemo_vfm.lightning.memory_budget import plan_memory_budget
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.train import TrainerConfig, train

    factory, latent, extra = case
    kw = fdl.build(case_recipe({"factory": factory, "latent": latent,
                                "overrides": [*extra, *args.overrides, f"trainer.memory_budget_gb={budget}"]})).keywords
    trainer = kw.get("trainer") or TrainerConfig()
    ema = kw.get("ema_decay", inspect.signature(train).parameters["ema_decay"].default)
    row = {"case": name, "factory": factory, "latent": list(latent), "budget_gib": budget, "host_gib": args.host_gib,
           "torchao": args.torchao}
    try:
        choice, current = plan_memory_budget(budget, model=kw["model"], data=kw["data"], trainer=trainer,
                                             optim=kw.get("optim") or OptimConfig(), lora=kw.get("lora"),
                                             keep=tuple(trainer.memory_budget_keep), ema=bool(ema), cuda=True,
                                             torchao=args.torchao, host_limit_gib=args.host_gib,
                                             objective=kw.get("objective"))
    except ValueError as e:
        return {**row, "plan": None, "why_not": str(e).split(":")[0]}
    return {**row, "plan": choice.settings.describe(current), "estimate_gib": round(choice.gib, 1),
            "host_share_gib": round(choice.host_gib, 1), "slowdown": round(choice.slowdown, 2)}


def short(settings: str) -> str:
    """A chooser's description without the config paths: ``activation_checkpointing=full, frozen_dtype=fp8``."""
    return re.sub(r"\b(trainer\.strategy|lora|optim)\.", "", settings)


def grid(plans: list[dict], measured: list[dict]) -> str:
    """Markdown: one row per case, one column per budget. A measured cell (same case and budget) shows the run (bold
    s/step, peak GiB), and what the budget takes now where that differs from what ran ("now:", not run); any other
    what the budget would choose ("plan:", estimates, not run), and, where a run of the same case at another budget
    ran those very settings with a peak under this budget, that run."""
    runs = {(r["case"], r["budget_gib"]): r for r in measured}
    by_cell = {(p["case"], p["budget_gib"]): p for p in plans}
    budgets = sorted({p["budget_gib"] for p in plans})
    lines = ["| case | " + " | ".join(f"{b:g} GiB" for b in budgets) + " |", "|---" * (len(budgets) + 1) + "|"]
    for case in dict.fromkeys(p["case"] for p in plans):
        cells = []
        for b in budgets:
            p, r = by_cell[(case, b)], runs.get((case, b))
            now = "" if r is None or p["plan"] == chosen_settings(r) else (
                f" (now: {short(p['plan'])}; est. {p['estimate_gib']:.1f} GiB, x{p['slowdown']:.2f}, not run)"
                if p["plan"] is not None else " (now: nothing fits)")
            if r is not None and verdict(r).startswith("yes"):
                cells.append(f"**{r['step_s']:.2f} s**, {r['peak_mem_gib']:.1f} GiB{now}")
            elif r is not None:
                cells.append(verdict(r) + now)
            elif p["plan"] is None:
                cells.append(f"plan: nothing fits ({'host' if 'on this host' in p['why_not'] else 'GPU'} memory)")
            else:
                same = [x for (c, _), x in runs.items() if c == case and verdict(x).startswith("yes")
                        and chosen_settings(x) == p["plan"] and x["peak_mem_gib"] <= b]
                cells.append(f"plan: {short(p['plan'])}; est. {p['estimate_gib']:.1f} GiB, x{p['slowdown']:.2f}"
                             + (f" (= the {same[0]['budget_gib']:g} GiB run: {same[0]['step_s']:.2f} s, peak "
                                f"{same[0]['peak_mem_gib']:.1f} GiB)" if same else ""))
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def classify(log: str, returncode: int) -> str | None:
    """None when the run finished, else why not."""
    if returncode == 0:
        return None
    if "nothing fits trainer.memory_budget_gb" in log:
        return "nothing fits (the chooser's estimate)"
    if "OutOfMemoryError" in log or "out of memory" in log:
        return "out of memory"
    return f"failed (exit {returncode})"


def own_env() -> dict:
    """This environment less a rendezvous the parent may carry (an earlier in-process run's ``MASTER_PORT`` would
    make the child's process group try a port that is still taken): each child is its own one-process run."""
    drop = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run_case(name: str, case: tuple, budget: float, args) -> dict:
    factory, latent, extra = case
    with tempfile.TemporaryDirectory(prefix="vfm-mem-") as tmp:
        overrides = [*extra, *args.overrides, f"trainer.memory_budget_gb={budget}",
                     *bookkeeping(name, Path(tmp), args.steps, args.every, args.device)]
        spec = {"factory": factory, "latent": latent, "budget": budget, "device": args.device, "overrides": overrides}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT, env=own_env())
            log, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            log, rc = out.decode(errors="replace") if isinstance(out, bytes) else out, -1
        res = {"case": name, "factory": factory, "latent": list(latent), "budget_gib": budget,
               "wall_s": round(time.perf_counter() - t0, 1), "chosen": re.findall(r"^memory budget .*$", log, re.M)[:1]}
        res["error"] = classify(log, rc) if rc != -1 else f"timeout after {args.timeout:.0f} s"
        perf = Path(tmp) / name / "perf.jsonl"
        rows = perf_rows(perf) if perf.is_file() else []
        res["last_logged_step"] = rows[-1]["step"] if rows else 0  # how far a run that failed got
        if rows:  # the first interval holds compilation and warm-up: s/step only from the later ones
            figures = read_perf(perf, skip=1)
            res["step_s"] = figures["step_s"] if len(rows) > 1 else None
            res["peak_mem_gib"] = figures["peak_mem_gib"]
        if res["error"]:
            res["log_tail"] = log.splitlines()[-LOG_TAIL:]
    return res


def chosen_settings(r: dict) -> str | None:
    """What a run's budget chose, as the chooser describes it (``lora.frozen_dtype=fp8, ...``); None: no line."""
    return r["chosen"][0].split(": ", 1)[-1].split(" (estimated")[0] if r["chosen"] else None


def verdict(r: dict) -> str:
    """'yes', or why not; a run the harness's time limit cut after it had stepped under the cap (the step times are
    measured) fits, and says where it was cut."""
    if not r["error"]:
        return "yes"
    if r["error"].startswith("timeout") and (r.get("last_logged_step") or 0) >= 2 and r.get("step_s"):
        return f"yes (stepped to step {r['last_logged_step']}, then the {r['error'].split('after ')[-1]} limit cut it)"
    return "no: " + r["error"]


def table(results: list[dict]) -> str:
    lines = ["| case | budget GiB | fits | s/step | peak GiB | chosen |", "|---|---|---|---|---|---|"]
    for r in results:
        chosen = chosen_settings(r) or "-"
        step = f"{r['step_s']:.3f}" if r.get("step_s") else "-"
        if r.get("last_logged_step") and verdict(r).startswith("no"):
            step += f" (until step {r['last_logged_step']})"
        peak = f"{r['peak_mem_gib']:.1f}" if r.get("peak_mem_gib") else "-"
        lines.append(f"| {r['case']} | {r['budget_gib']:g} | {verdict(r)} | {step} "
                     f"| {peak} | {chosen} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 4))
    for case in dict.fromkeys(r["case"] for r in results):
        rows = [r for r in results if r["case"] == case]
        pts = sorted((r["budget_gib"], r["step_s"], not r["error"]) for r in rows if r.get("step_s"))
        (line,) = ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], label=case)
        for x, y, done in pts:  # hollow: stepped, then cut by the time limit
            ax.plot(x, y, "o", color=line.get_color(), mfc=line.get_color() if done else "none")
        oom = [r["budget_gib"] for r in rows if r["error"] == "out of memory"]
        ax.plot(oom, [0] * len(oom), "x", color=line.get_color(), ms=9)
    ax.set_title("x: out of memory; hollow: stepped, then cut by the time limit", fontsize=8)
    ax.set_xlabel("memory budget (GiB, emulated card size)")
    ax.set_ylabel("s / step")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=120)


def merge(files: list[Path], out: Path) -> None:
    """One matrix from several runs' JSON files (each row keeps the device, date and commit of its run), ordered as
    :data:`CASES`, then by budget; a cell run in several files keeps the row of the file named last."""
    files = list(dict.fromkeys(f.resolve() for f in files))  # a file named twice counts once
    if out.resolve() in files:
        raise SystemExit(f"--out {out} is one of the --merge inputs: name another file")
    rows = []
    for f in files:
        run = json.loads(f.read_text())
        rows += [{**r, "device": run["device"], "date": run["date"], "commit": run["commit"], "source": f.name}
                 for r in run["results"]]
    rows = list({(r["case"], r["budget_gib"]): r for r in rows}.values())  # the last file's row of a cell
    order = {name: i for i, name in enumerate(CASES)}
    rows.sort(key=lambda r: (order.get(r["case"], len(order)), r["budget_gib"]))
    out.write_text(json.dumps({"merged_from": [f.name for f in files], "results": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(rows) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(table(rows))
    print(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--budgets", default="24,32,48,80", help="GiB per GPU, e.g. 24,32,48,80")
    p.add_argument("--only", help="comma-separated case names")
    p.add_argument("--case", action="append", default=[], help="name=factory:TxHxW instead of the built-in cases")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="an override for every case")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--commit")
    p.add_argument("--out")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="combine the rows of earlier runs into --out (JSON, "
                   "Markdown table and plot; nothing is run; a cell in several files: the last file's row)")
    p.add_argument("--plan", action="store_true", help="nothing is run: what each budget would choose on a GPU "
                   "(estimates), beside the runs of --measured, as one grid")
    p.add_argument("--measured", help="with --plan: a (merged) matrix JSON whose runs fill their cells")
    p.add_argument("--host-gib", type=float, default=240.0, help="with --plan: free host memory per process (GiB)")
    p.add_argument("--torchao", action=argparse.BooleanOptionalAction, default=False,
                   help="with --plan: torchao installed (adamw8bit may be chosen); default: not, as on the GPU runs")
    args = p.parse_args(argv)
    if args.child:
        run_child(json.loads(args.child))
        return 0
    if not args.out:
        p.error("--out is required")
    if args.merge:
        merge([Path(f) for f in args.merge], Path(args.out))
        return 0
    cases = dict(parse_case(c) for c in args.case) if args.case else dict(CASES)
    if args.only:
        names = args.only.split(",")
        if unknown := [n for n in names if n not in cases]:
            p.error(f"unknown case(s) {unknown}; the cases are {sorted(cases)}")
        cases = {n: cases[n] for n in names}
    budgets = [float(b) for b in args.budgets.split(",")]
    if args.plan:
        plans = [plan_case(name, case, b, args) for name, case in cases.items() for b in budgets]
        measured = json.loads(Path(args.measured).read_text())["results"] if args.measured else []
        md = grid(plans, measured)
        Path(args.out).write_text(json.dumps({"plans": plans, "measured_from": args.measured}, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(md + "\n")
        print(md)
        return 0
    env = {**environment(args.device, args.commit), "command": shlex.join(["python", *sys.argv]),
           "emulation": "card size = torch.cuda.set_per_process_memory_fraction(budget / total memory); random "
                        "weights and latents" if args.device == "cuda" else "CPU: no memory cap"}
    out = Path(args.out)
    results = []
    for name, case in cases.items():
        for budget in budgets:
            results.append(r := run_case(name, case, budget, args))
            print(f"{name} @ {budget:g} GiB: {r['error'] or 'fits'} step_s={r.get('step_s')} "
                  f"peak={r.get('peak_mem_gib')} | {(r['chosen'] or ['-'])[0]}", flush=True)
            write_json(str(out), env, results)  # after every run: a killed matrix keeps what it measured
            out.with_suffix(".md").write_text(table(results) + "\n")
    plot(results, out.with_suffix(".png"))
    print(table(results))
    print(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    # not fitting is a result, as is a run cut after it stepped; a run that failed otherwise (or timed out) is not
    return 1 if any(verdict(r).startswith(("no: failed", "no: timeout")) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
