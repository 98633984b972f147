"""Train our causal video tokenizer: ``python launchers/train_tokenizer.py --factory NAME [--yes] [overrides...]``.

NeMo-Run CLI over :func:`nemo_vfm.train_tokenizer.train_tokenizer` with the factories in
``recipes/tokenizer.py`` (``tokenizer_4x8x8``, ``tokenizer_8x8x8``, ``tokenizer_8x16x16``,
``tokenizer_tiny``). Unlike nemo-run's own CLI, errors exit non-zero. Add ``-v`` for full tracebacks.

    python launchers/train_tokenizer.py --factory tokenizer_4x8x8 --yes max_steps=300 out_dir=runs/tok
    python launchers/train_tokenizer.py --factory tokenizer_8x16x16 --yes tokenizer.width=96 data.height=256
"""

import sys


def main(argv: list[str]) -> int:
    import nemo_vfm_recipes.tokenizer  # noqa: F401  (registers the factories)
    from nemo_vfm.train_tokenizer import train_tokenizer
    from nemo_vfm_recipes.cli import run_cli

    return run_cli(train_tokenizer, argv, "launchers/train_tokenizer.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
