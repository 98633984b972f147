"""Helpers for NeMo-Run CLI entry points (``launchers/*.py``)."""

import types


def _parse_tuple(value: str, annotation):
    """``model.patch_size=[1,2,2]`` (or ``(1,2,2)``) for a ``tuple[int, int, int]`` field."""
    import ast
    import typing

    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError) as e:
        raise ValueError(f"{value!r} is not a tuple literal such as [1,2,2]") from e
    if not isinstance(parsed, (list, tuple)):
        raise ValueError(f"{value!r} is not a tuple literal such as [1,2,2]")
    args = typing.get_args(annotation)
    if args and args[-1] is not Ellipsis and len(args) != len(parsed):
        raise ValueError(f"{value!r} has {len(parsed)} values, the field takes {len(args)}")
    return tuple(parsed)


def teach_parsers() -> None:
    """Let nemo-run's CLI parse overrides that nemo-run 0.11 cannot: fields annotated ``X | None`` (PEP 604;
    it only knows ``Optional[X]``, so ``data.path=/x`` on ``path: str | None`` fails) and tuples
    (``model.patch_size=[1,2,2]``). Idempotent; call before parsing."""
    from nemo_run.cli.cli_parser import type_parser

    if types.UnionType not in type_parser.custom_parsers:
        type_parser.register_parser(types.UnionType)(type_parser.parse_union)
    if tuple not in type_parser.custom_parsers:
        type_parser.register_parser(tuple)(_parse_tuple)
    type_parser.get_parser.cache_clear()


def run_cli(target, argv: list[str], prog: str) -> int:
    """NeMo-Run's CLI over ``target`` (``--factory``, ``--yes``, ``--dryrun``, ``--to-yaml``, dotted overrides),
    returning an exit code: unlike ``run.cli.main``, an unknown factory or a bad override is non-zero."""
    import sys

    import catalogue
    import nemo_run as run
    import typer
    from nemo_run.config import get_type_namespace

    teach_parsers()
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
