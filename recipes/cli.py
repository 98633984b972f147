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


STRATEGY = "trainer.strategy."


def strategy_knobs() -> list[str]:
    """The knobs of ``VFMParallelStrategy`` (what ``trainer.strategy.<knob>=...`` may name)."""
    import inspect

    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    return [n for n in inspect.signature(VFMParallelStrategy.__init__).parameters if n != "self"]


def strategy_overrides(argv: list[str]) -> list[str]:
    """The knob names of the ``trainer.strategy.<knob>=value`` overrides in ``argv``."""
    return [a.split("=", 1)[0][len(STRATEGY):] for a in argv if a.startswith(STRATEGY) and "=" in a]


def memory_overrides(argv: list[str]) -> tuple[str, ...]:
    """The memory-budget knobs (``trainer.memory_budget_keep`` names) that ``argv``'s overrides set, e.g.
    ``("activation_checkpointing",)`` for ``trainer.strategy.activation_checkpointing=full``."""
    from nemo_vfm.lightning.memory_budget import KNOB_NAMES

    keys = {a.split("=", 1)[0] for a in argv if "=" in a and not a.startswith("-")}
    return tuple(name for name, path in KNOB_NAMES.items() if path in keys)


def keep_memory_knobs(recipe, names: tuple[str, ...]):
    """Add ``names`` to the recipe's ``trainer.memory_budget_keep``: a memory knob the user set stays as set under
    ``trainer.memory_budget_gb`` (the budget chooses the others; a recipe without one, e.g. the tokenizer's, is left
    as it is). Returns ``recipe``."""
    trainer = getattr(recipe, "trainer", None)
    if names and trainer is not None:
        kept = tuple(trainer.memory_budget_keep or ())
        trainer.memory_budget_keep = tuple(dict.fromkeys((*kept, *names)))
    return recipe


def _wrapped(factory, *, strategy: bool, keep: tuple[str, ...]):
    """``factory`` whose recipe holds a ``VFMParallelStrategy`` config in place of a strategy name such as
    ``"auto"`` (``strategy``: so that ``trainer.strategy.<knob>=...`` overrides have a config to set) and keeps the
    memory knobs ``keep`` (:func:`keep_memory_knobs`)."""
    import functools

    @functools.wraps(factory)
    def wrapped():
        from nemo_vfm_recipes import parallel

        recipe = factory()
        if strategy:
            parallel.strategy(recipe)
        return keep_memory_knobs(recipe, keep)

    wrapped.wrapped, wrapped.__factory__ = getattr(factory, "wrapped", factory), True
    return wrapped


def run_cli(target, argv: list[str], prog: str) -> int:
    """NeMo-Run's CLI over ``target`` (``--factory``, ``--yes``, ``--dryrun``, ``--to-yaml``, dotted overrides),
    returning an exit code: unlike ``run.cli.main``, an unknown factory or a bad override is non-zero (2).

    A designed stop or configuration error of the run (:func:`nemo_vfm.errors.user_message`: e.g. training stopped
    on NaN/Inf, a refused checkpoint, a config check) prints as one line, ``error: <the project's sentence>``, and
    returns 1 (``[rank R]`` before the sentence under torchrun); any other exception propagates with its traceback.
    ``-v`` gives every error its traceback.

    ``trainer.strategy.<knob>=value`` works on every factory: where the recipe names a Lightning strategy
    (``"auto"``), it becomes a ``VFMParallelStrategy`` first; an unknown knob exits 2 naming the valid ones. A memory
    knob set on the command line (``trainer.strategy.activation_checkpointing``, ``optim.name``, ...) joins
    ``trainer.memory_budget_keep``, so a recipe's ``trainer.memory_budget_gb`` does not choose it over the user."""
    import sys

    import catalogue
    import nemo_run as run
    import typer
    from nemo_run.config import get_type_namespace

    teach_parsers()
    name = None
    if "--factory" in argv:
        i = argv.index("--factory") + 1
        name = argv[i] if i < len(argv) else ""
        known = sorted(key[-1] for key in catalogue._get_all([get_type_namespace(target)]))
        if name not in known:
            print(f"error: unknown factory {name!r}; choose one of: {', '.join(known)}", file=sys.stderr)
            return 2
    knobs = strategy_overrides(argv)
    if knobs:
        valid = strategy_knobs()
        bad = [k for k in knobs if k.split(".")[0] not in valid]
        if bad:
            print(f"error: unknown parallel strategy knob {STRATEGY}{bad[0]}; valid knobs: {', '.join(valid)}",
                  file=sys.stderr)
            return 2
    keep = memory_overrides(argv)
    key = (get_type_namespace(target), name)
    original = catalogue._get(key) if name is not None and (knobs or keep) else None
    if original is not None:  # for this call only (in-process callers run several)
        catalogue._set(key, _wrapped(original, strategy=bool(knobs), keep=keep))
    entry = run.cli.entrypoint(namespace="vfm")(target)
    app = typer.Typer(pretty_exceptions_enable=False)
    entry.cli_entrypoint._add_command(app, is_main=True)
    _propagate_errors(app)
    try:
        rc = app(args=argv, prog_name=prog, standalone_mode=False)
    except Exception as e:
        code, message = _user_error(e)
        if code is None or "-v" in argv or "--verbose" in argv:
            raise  # a bug or an environment failure (or -v): the traceback
        # One write per line: under torchrun the ranks share stderr, and a separate newline write interleaves them.
        sys.stderr.write(f"error: {_rank_prefix()}{message}\n")
        sys.stderr.flush()
        return code
    finally:
        if original is not None:
            catalogue._set(key, original)
    return rc if isinstance(rc, int) else 0


def _propagate_errors(app) -> None:
    """Make nemo-run's commands on ``app`` raise what the task raises: without ``-v`` nemo-run prints any exception
    as ``Unexpected error: ...`` (our designed stops included) and drops the traceback of the real surprises."""
    import functools

    for info in app.registered_commands:
        @functools.wraps(info.callback)  # typer reads the parameters through __wrapped__
        def command(*args, _callback=info.callback, **kwargs):
            return _callback(*args, **{**kwargs, "verbose": True} if "verbose" in kwargs else kwargs)

        info.callback = command


def _user_error(e: Exception) -> tuple[int | None, str]:
    """``(exit code, one-line message)`` of an error the user can act on: a bad command line (nemo-run's parse and
    option errors: 2) or the project's own designed stop or configuration error (:func:`nemo_vfm.errors.
    user_message`: 1); ``(None, "")`` for anything else."""
    from nemo_run.cli.api import RunContextError
    from nemo_run.cli.cli_parser import CLIException

    from nemo_vfm.errors import user_message

    if isinstance(e, (CLIException, RunContextError)):
        return 2, str(e)
    message = user_message(e, ("nemo_vfm", "nemo_vfm_recipes"))
    return (None, "") if message is None else (1, message)


def _rank_prefix() -> str:
    """``"[rank R] "`` in a multi-process run (each rank prints its own stop; torchrun reports the exit codes)."""
    import os

    return f"[rank {os.environ.get('RANK', '?')}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
