"""The end-of-run table: per-stage throughput, workers, utilisation and the bottleneck."""

from __future__ import annotations

from nemo_vfm.curation.engine import PipelineReport


def report_rows(report: PipelineReport) -> list[list[str]]:
    rows = []
    for s in report.stages:
        mark = " <- bottleneck" if s.name == report.bottleneck else ""
        rows.append([s.name, f"{s.workers} (max {s.max_workers})", str(s.items), f"{s.mean_cost_s * 1e3:.1f}",
                     f"{s.items_per_s:.2f}", f"{s.capacity_items_per_s:.1f}", f"{s.utilization:.0%}",
                     f"{s.load_s_per_input * 1e3:.1f}{mark}"])
    return rows


HEADER = ["stage", "workers", "items", "ms/item", "items/s", "capacity items/s", "busy", "ms/input (load)"]


def report_table(report: PipelineReport):
    """A ``rich`` table of the report (print it with ``rich.console.Console().print``)."""
    from rich.table import Table

    title = (f"{report.engine} engine, {report.budget:g} worker slots, {report.inputs} inputs in {report.wall_s:.1f} s: "
             f"{report.inputs_per_s:.2f} inputs/s (balanced ideal {report.ideal_inputs_per_s:.2f}), "
             f"bottleneck: {report.bottleneck}")
    table = Table(title=title)
    for h in HEADER:
        table.add_column(h, justify="left" if h == "stage" else "right")
    for row in report_rows(report):
        table.add_row(*row)
    return table


def report_markdown(report: PipelineReport) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in report_rows(report)]
    return "\n".join(lines)
