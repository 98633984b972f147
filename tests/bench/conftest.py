import sys
from pathlib import Path

# bench/ holds scripts, not a package: make its modules importable for the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
