"""Package discovery only (metadata lives in pyproject.toml).

The top-level ``recipes/`` folder is installed as ``nemo_vfm_recipes`` so that it never shadows
another project's bare ``recipes`` package.
"""

from setuptools import find_packages, setup

recipes = ["nemo_vfm_recipes"] + [f"nemo_vfm_recipes.{p}" for p in find_packages("recipes")]
setup(
    packages=find_packages(include=["nemo_vfm", "nemo_vfm.*"]) + recipes,
    package_dir={"nemo_vfm_recipes": "recipes"},
)
