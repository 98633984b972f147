"""A model family is one object (its ``FamilySpec`` and, for ``vfm generate``, its generation adapter): generic code
applies it and never picks a family by name. No ``parallelize_<family>`` wrapper exists, and outside a family's own
folder (``nemo_vfm/models/<family>/``) and its inference module no code compares against a family name or tests a
family's config class."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "nemo_vfm"
FAMILIES = ("dit", "stdit", "moviegen", "wan", "cosmos", "hunyuan", "ltx2", "kandinsky6")
NAMES = "dit|stdit|st_dit|moviegen|wan|cosmos|hunyuan|hunyuanvideo|ltx2|kandinsky6"
CONFIGS = "DiTConfig|STDiTConfig|MovieGenConfig|WanConfig|CosmosConfig|HunyuanVideoConfig|LTX2Config|Kandinsky6Config"
BY_NAME = re.compile(
    rf"""(==|!=)\s*["']({NAMES})["']"""  # kind == "wan"
    rf"""|["']({NAMES})["']\s*(==|!=)"""  # "wan" == kind
    rf"""|["']({NAMES})["']\s+(not\s+)?in\b"""  # "hunyuan" in kind
    rf"""|isinstance\([^)]*\b({CONFIGS})\b"""  # isinstance(cfg, WanConfig)
)
# generic layers: what consumes the family objects
GENERIC = ("cli", "data", "inference", "lightning", "parallel", "models/common", "train.py", "models/spec.py",
           "models/families.py", "models/flops.py")
# the families' own inference modules (their generation adapters) may hold family-specific code
OWN = tuple(f"inference/{f}.py" for f in FAMILIES)


def _files(parts):
    for part in parts:
        p = ROOT / part
        yield from ([p] if p.is_file() else sorted(p.rglob("*.py")))


def test_no_parallelize_wrapper_per_family():
    wrapper = re.compile(rf"^\s*(def\s+parallelize_({NAMES})\b|parallelize_({NAMES})\s*=)", re.M)
    hits = [f"{f.relative_to(ROOT)}: {m.group(0).strip()}" for f in ROOT.rglob("*.py")
            for m in wrapper.finditer(f.read_text())]
    assert not hits, f"a family's parallelize wrapper; declare its plans on its FamilySpec instead: {hits}"


def test_generic_code_picks_no_family_by_name():
    hits = []
    for f in _files(GENERIC):
        rel = f.relative_to(ROOT).as_posix()
        if rel in OWN:
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if BY_NAME.search(line):
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, ("family picked by name outside its family object; declare what differs on its FamilySpec "
                      f"or generation adapter: {hits}")


def test_benchmarks_recipes_and_launchers_pick_no_family_by_name():
    """Outside the library too: a benchmark that runs several families (``bench/family_step.py``) keeps what
    differs in a table keyed by family, not in a comparison chain."""
    repo = ROOT.parent
    hits = [f"{f.relative_to(repo)}:{n}: {line.strip()}"
            for part in ("bench", "recipes", "launchers") for f in sorted((repo / part).rglob("*.py"))
            for n, line in enumerate(f.read_text().splitlines(), 1) if BY_NAME.search(line)]
    assert not hits, f"family picked by name; key what differs by family in a table instead: {hits}"
