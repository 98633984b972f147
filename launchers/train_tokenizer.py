"""Train our causal video tokenizer: ``python launchers/train_tokenizer.py --factory NAME [--yes] [overrides...]``.

NeMo-Run CLI over :func:`nemo_vfm.tokenizers.train.train_tokenizer` with the factories in
``recipes/tokenizer.py`` (``tokenizer_4x8x8``, ``tokenizer_8x8x8``, ``tokenizer_8x16x16``,
``tokenizer_tiny``). Unlike nemo-run's own CLI, errors exit non-zero. Add ``-v`` for full tracebacks.

    python launchers/train_tokenizer.py --factory tokenizer_4x8x8 --yes max_steps=300 out_dir=runs/tok
    python launchers/train_tokenizer.py --factory tokenizer_8x16x16 --yes tokenizer.width=96 data.height=256
"""

import sys


def main(argv: list[str]) -> int:
    import catalogue
    import nemo_run as run
    import typer
    from nemo_run.config import get_type_namespace

    import nemo_vfm_recipes.tokenizer  # noqa: F401  (registers the factories)
    from nemo_vfm.tokenizers.train import train_tokenizer

    if "--factory" in argv:
        i = argv.index("--factory") + 1
        name = argv[i] if i < len(argv) else ""
        known = sorted(key[-1] for key in catalogue._get_all([get_type_namespace(train_tokenizer)]))
        if name not in known:
            print(f"error: unknown factory {name!r}; choose one of: {', '.join(known)}", file=sys.stderr)
            return 2
    entry = run.cli.entrypoint(namespace="vfm")(train_tokenizer)
    app = typer.Typer(pretty_exceptions_enable=False)
    entry.cli_entrypoint._add_command(app, is_main=True)
    rc = app(args=argv, prog_name="launchers/train_tokenizer.py", standalone_mode=False)
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
