"""Every ``bench/results/...`` path that the docs and the README cite exists (a glob or a ``{a,b}`` set: each member;
``<name>`` and ``$name`` placeholders: any file). A path that a documented command writes (``--out PATH``) is where a
rerun puts its result, not a citation: it is left out, and so are the commands that read it."""

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"bench/results/(?:[\w.*<>$/+-]|\{[^}\s]*\})+")
WRITTEN = re.compile(r"--out (" + CITED.pattern + ")")


def expand(cited: str) -> list[str]:
    """The glob patterns a citation stands for."""
    pattern = re.sub(r"<[^>]*>|\$\w+", "*", cited.rstrip("."))
    parts = re.split(r"(\{[^}]*\})", pattern)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def citations() -> dict[str, list[str]]:
    """Cited path -> the documents that cite it."""
    docs = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    written = {w for doc in docs for w in WRITTEN.findall(doc.read_text())}
    out: dict[str, list[str]] = {}
    for doc in docs:
        for cited in CITED.findall(doc.read_text()):
            if cited not in written:
                out.setdefault(cited, []).append(doc.name)
    return out


def test_expand():
    assert expand("bench/results/a_{x,y}.{json,png}.") == ["bench/results/a_x.json", "bench/results/a_x.png",
                                                          "bench/results/a_y.json", "bench/results/a_y.png"]
    assert expand("bench/results/c_<engine>_$mode.json") == ["bench/results/c_*_*.json"]


def test_every_cited_result_exists():
    cited = citations()
    assert len(cited) > 20  # the scan found the citations
    missing = {c: docs for c, docs in cited.items()
               if not all(any(ROOT.glob(p.rstrip("/"))) for p in expand(c))}
    assert not missing, f"cited in the docs but not in bench/results: {missing}"
