"""Helpers for NeMo-Run CLI entry points (``launchers/*.py``)."""

import types


def teach_pep604_unions() -> None:
    """Let nemo-run's CLI parse overrides of fields annotated ``X | None`` (PEP 604), not only
    ``Optional[X]``: nemo-run 0.11 has no parser for ``types.UnionType``, so ``data.path=/x`` on a
    ``path: str | None`` field fails. Idempotent; call before parsing."""
    from nemo_run.cli.cli_parser import type_parser

    if types.UnionType not in type_parser.custom_parsers:
        type_parser.register_parser(types.UnionType)(type_parser.parse_union)
        type_parser.get_parser.cache_clear()


def run_cli(target, argv: list[str], prog: str) -> int:
    """NeMo-Run's CLI over ``target`` (``--factory``, ``--yes``, ``--dryrun``, ``--to-yaml``, dotted overrides),
    returning an exit code: unlike ``run.cli.main``, an unknown factory or a bad override is non-zero."""
    import sys

    import catalogue
    import nemo_run as run
    import typer
    from nemo_run.config import get_type_namespace

    teach_pep604_unions()
    if "--factory" in argv:
        i = argv.index("--factory") + 1
        name = argv[i] if i < len(argv) else ""
        known = sorted(key[-1] for key in catalogue._get_all([get_type_namespace(target)]))
        if name not in known:
            print(f"error: unknown factory {name!r}; choose one of: {', '.join(known)}", file=sys.stderr)
            return 2
    entry = run.cli.entrypoint(namespace="vfm")(target)
    app = typer.Typer(pretty_exceptions_enable=False)
    entry.cli_entrypoint._add_command(app, is_main=True)
    rc = app(args=argv, prog_name=prog, standalone_mode=False)
    return rc if isinstance(rc, int) else 0
