import sys
from pathlib import Path

# bench/ is a package at the repository root, not installed with nemo_vfm: make `import bench` work from any folder
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.append(ROOT)
