"""The ``dpq-spark`` command line (also a Databricks Python-wheel task entry point).

Subcommands::

    dpq-spark --version
    dpq-spark run --config conf/goodreads.toml [--epsilon 0.5 ...]   # the dp_quantiles job
    dpq-spark run --dry-run --config conf/goodreads.toml   # what it would spend; reads no data
    dpq-spark ledger init URL --dataset ID --epsilon-cap 10 [--delta-cap 1e-6]
    dpq-spark ledger show --dataset ID (--config FILE | --ledger URL) [--json]
    dpq-spark ledger set-cap --dataset ID --epsilon-cap 10 [--delta-cap 1e-6] (--config | --ledger)
    dpq-spark ledger cancel ID --force --reason "job known dead: ..." [--by NAME] (--config | --ledger)
    dpq-spark ledger export --format csv|json [--dataset ID] [--output FILE] (--config | --ledger)

A ledger is ``sqlite:///ABS/PATH``, a plain SQLite path, or ``postgresql://user@host/db`` (the
password from ``PGPASSWORD``/``PGPASSFILE`` or ``--password-file``, never on the command line).
``--config`` takes the ledger of a job config (its ``ledger.url``/``ledger.path``, relative
paths resolved against the config file's directory, and ``ledger.password_file``). Only
``init`` creates a ledger; the other commands open an existing one.

``run`` takes exactly the flags of ``jobs/dp_quantiles.py`` (see :func:`dpq_spark.pipeline.job.main`).
Exit codes of ``ledger``: 0 done, 2 refused (bad arguments, missing or unreadable ledger, a
record that is not ``reserved``); errors are one line on stderr, never a traceback. A closed
standard output (``dpq-spark ledger export | head``) ends the command quietly with exit code
141 (128 + SIGPIPE, what a shell reports for a command killed by the pipe).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dpq_spark._version import __version__

__all__ = ["main"]


def _ledger_from(args: argparse.Namespace, *, create: bool = False):
    from dpq_spark.pipeline.config import ConfigError, ledger_url
    from dpq_spark.pipeline.ledger import open_ledger

    url, password_file = getattr(args, "ledger", None), getattr(args, "password_file", None)
    if url is None and getattr(args, "config", None) is not None:
        section = _config_ledger(args)
        url = ledger_url(section)
        password_file = password_file or section.get("password_file")
    if url is None:
        raise ConfigError("give the ledger with --ledger URL or --config FILE")
    if not create:
        return open_ledger(url, password_file=password_file)
    return url, password_file


def _config_ledger(args: argparse.Namespace) -> dict:
    """The ``[ledger]`` section of ``--config`` (empty without one)."""
    from dpq_spark.pipeline.config import ConfigError, read_raw

    if getattr(args, "config", None) is None:
        return {}
    section = read_raw(args.config).get("ledger")
    if not isinstance(section, dict):
        raise ConfigError(f"{args.config!r} has no [ledger] section")
    return section


def _dataset(args: argparse.Namespace) -> str:
    """``--dataset``, or the ``ledger.dataset_id`` of ``--config``."""
    from dpq_spark.pipeline.config import ConfigError

    dataset = args.dataset or _config_ledger(args).get("dataset_id")
    if not isinstance(dataset, str) or not dataset:
        raise ConfigError("give the dataset with --dataset ID (or --config FILE whose [ledger] "
                          "names `dataset_id`)")
    return dataset


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _show(args: argparse.Namespace) -> int:
    ledger = _ledger_from(args)
    args.dataset = _dataset(args)
    records = ledger.records(args.dataset)
    usage = ledger.usage(args.dataset)
    if args.json:
        print(json.dumps({
            "ledger": ledger.name,
            "dataset_id": args.dataset,
            "usage": {**dataclasses.asdict(usage), "epsilon_remaining": usage.epsilon_remaining,
                      "delta_remaining": usage.delta_remaining},
            "records": [dataclasses.asdict(r) for r in records],
        }, indent=2))
        return 0
    print(f"ledger {ledger.name}")
    if usage.epsilon_cap is None:
        print(f"dataset {args.dataset!r}: no budget in this ledger (known: "
              f"{', '.join(map(repr, ledger.datasets())) or 'none'})")
    else:
        print(f"dataset {args.dataset!r}: epsilon spent {usage.epsilon_spent:g} of cap "
              f"{_fmt(usage.epsilon_cap)} (left {_fmt(usage.epsilon_remaining)}); delta spent "
              f"{usage.delta_spent:g} of cap {_fmt(usage.delta_cap)}")
        print(f"privacy unit: {ledger.unit(args.dataset).describe()}")
    if not records:
        print("no records")
        return 0
    header = ("id", "status", "epsilon", "delta", "mechanism", "reserved_at (UTC)", "job", "host",
              "output / note")
    rows = [(str(r.id), r.status, f"{r.epsilon:g}", f"{r.delta:g}", r.mechanism,
             r.reserved_at[:19], r.job or "", f"{r.host or ''}:{r.pid or ''}",
             " | ".join(x for x in (r.output, r.note,
                                    r.cancelled_by and f"cancelled by {r.cancelled_by}") if x))
            for r in records]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _set_cap(args: argparse.Namespace) -> int:
    from dpq_spark.pipeline.config import ConfigError

    if args.epsilon_cap is None and args.delta_cap is None:
        raise ConfigError("give --epsilon-cap, --delta-cap or both (a cap not given keeps its "
                          "value)")
    ledger = _ledger_from(args)
    dataset = _dataset(args)
    usage = ledger.set_cap(dataset, epsilon_cap=args.epsilon_cap, delta_cap=args.delta_cap,
                           force=args.force)
    print(f"ledger {ledger.name}: dataset {dataset!r}: epsilon_cap={usage.epsilon_cap:g} "
          f"(spent {usage.epsilon_spent:g}), delta_cap={usage.delta_cap:g} "
          f"(spent {usage.delta_spent:g})")
    return 0


def _init(args: argparse.Namespace) -> int:
    from dpq_spark.pipeline.config import ConfigError, ledger_url
    from dpq_spark.pipeline.ledger import init_ledger

    if args.url is not None and (args.ledger or args.config):
        raise ConfigError("give the ledger once: URL, --ledger or --config")
    if args.url is not None:
        url, password_file = ledger_url({"url": args.url}), args.password_file
    else:
        url, password_file = _ledger_from(args, create=True)
    from dpq_spark.pipeline.ledger import PrivacyUnit

    section = _config_ledger(args)
    dataset = args.dataset or section.get("dataset_id")
    epsilon_cap = args.epsilon_cap if args.epsilon_cap is not None else section.get("epsilon_cap")
    delta_cap = args.delta_cap if args.delta_cap is not None else section.get("delta_cap", 0.0)
    if dataset is not None and epsilon_cap is None:
        raise ConfigError("`--epsilon-cap` is required with `--dataset` (or in the config's "
                          "[ledger])")
    unit = None
    if args.privacy_unit is not None or args.neighboring != "add_remove" or (
            args.max_rows_per_unit, args.max_groups_per_unit) != (1, 1):
        try:
            unit = PrivacyUnit(args.privacy_unit, max_rows_per_unit=args.max_rows_per_unit,
                               max_groups_per_unit=args.max_groups_per_unit,
                               neighboring=args.neighboring)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    ledger = init_ledger(url, dataset_id=dataset, epsilon_cap=epsilon_cap,
                         delta_cap=delta_cap, password_file=password_file, unit=unit)
    what = (f"; dataset {dataset!r}: epsilon_cap={epsilon_cap:g}, delta_cap={delta_cap:g}, "
            f"privacy unit {ledger.unit(dataset).describe()}" if dataset else "")
    print(f"ledger {ledger.name}: ready{what}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from dpq_spark.pipeline.config import ConfigError

    if not args.force:
        raise ConfigError(
            "`ledger cancel` gives budget back: use it only for a reservation whose job is known "
            "to be dead (a live job would still release), and confirm with --force")
    if not args.reason or not args.reason.strip():
        raise ConfigError("`--reason` is required (why the job is known dead; no private data)")
    ledger = _ledger_from(args)
    ledger.cancel(args.id, f"operator: {args.reason.strip()}", by=args.by or None)
    rec = ledger.get(args.id)
    print(f"ledger {ledger.name}: record {rec.id} of dataset {rec.dataset_id!r} cancelled by "
          f"{rec.cancelled_by}; epsilon {rec.epsilon:g} given back")
    return 0


def _export(args: argparse.Namespace) -> int:
    ledger = _ledger_from(args)
    text = ledger.export(args.format, dataset_id=args.dataset)
    if args.output:
        with open(args.output, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        print(f"ledger {ledger.name}: exported to {args.output}")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _where(q: argparse.ArgumentParser) -> None:
    where = q.add_mutually_exclusive_group()
    where.add_argument("--ledger", help="the ledger URL (sqlite:///PATH, a path, postgresql://...)")
    where.add_argument("--config", help="a job config whose [ledger] to use")
    q.add_argument("--password-file", help="PostgreSQL: a file holding the password")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpq-spark", description="Differentially private quantiles "
                                "on Spark: run the release job and administer the privacy ledger.")
    p.add_argument("--version", action="version", version=f"dpq-spark {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the dp_quantiles job (flags: dpq-spark run --help)",
                   add_help=False)
    led = sub.add_parser("ledger", help="inspect or administer the privacy ledger")
    led_sub = led.add_subparsers(dest="action", required=True)

    q = led_sub.add_parser("init", help="create a ledger (and a dataset's budget)")
    q.add_argument("url", nargs="?", help="the ledger URL (or use --ledger / --config)")
    q.add_argument("--dataset", help="a dataset id to create with its caps (default with "
                   "--config: the config's ledger.dataset_id)")
    q.add_argument("--epsilon-cap", type=float, help="(default with --config: its "
                   "ledger.epsilon_cap)")
    q.add_argument("--delta-cap", type=float, help="(default: the config's, else 0)")
    q.add_argument("--privacy-unit", metavar="COLUMN", help="whose privacy the budget counts: "
                   "all rows of one value of COLUMN (default: one row)")
    q.add_argument("--max-rows-per-unit", type=int, default=1,
                   help="with --privacy-unit: default rows kept per unit and group")
    q.add_argument("--max-groups-per-unit", type=int, default=1,
                   help="with --privacy-unit: default groups kept per unit")
    q.add_argument("--neighboring", choices=("add_remove", "swap"), default="add_remove",
                   help="the neighbouring relation of every release charged to the budget")
    _where(q)

    q = led_sub.add_parser("show", help="print the records and budget of a dataset")
    q.add_argument("--dataset", help="the dataset id (default with --config: the config's)")
    q.add_argument("--json", action="store_true", help="print JSON")
    _where(q)

    q = led_sub.add_parser("set-cap", help="change an existing dataset's caps (the only way to "
                           "raise them; never creates a budget)")
    q.add_argument("--dataset", help="the dataset id (default with --config: the config's)")
    q.add_argument("--epsilon-cap", type=float, help="the new epsilon cap (default: unchanged)")
    q.add_argument("--delta-cap", type=float, help="the new delta cap (default: unchanged)")
    q.add_argument("--force", action="store_true",
                   help="allow a cap below what the dataset has already spent")
    _where(q)

    q = led_sub.add_parser("cancel", help="give back a reservation whose job is known dead")
    q.add_argument("id", type=int, help="the ledger record id (see `ledger show`)")
    q.add_argument("--force", action="store_true", help="confirm: the job is known dead")
    q.add_argument("--reason", help="why (stored in the record)")
    q.add_argument("--by", help="who cancels (default: the OS user)")
    _where(q)

    q = led_sub.add_parser("export", help="the releases as CSV or JSON, for an audit")
    q.add_argument("--format", choices=("csv", "json"), default="json")
    q.add_argument("--dataset", help="only this dataset (default: all)")
    q.add_argument("--output", help="write to this file (default: stdout)")
    _where(q)
    return p


_ACTIONS = {"init": _init, "show": _show, "set-cap": _set_cap, "cancel": _cancel,
            "export": _export}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dpq-spark`` console script; returns the exit code."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at interpreter exit
    except BrokenPipeError:
        from dpq_spark.pipeline.job import stdout_closed

        return stdout_closed()  # quietly, exit code 141
    return code


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        from dpq_spark.pipeline.job import main as job_main

        return job_main(argv[1:], prog="dpq-spark run")
    args = build_parser().parse_args(argv)
    from dpq_spark.pipeline.config import ConfigError
    from dpq_spark.pipeline.ledger import LedgerError

    try:
        return _ACTIONS[args.action](args)
    except (ConfigError, LedgerError) as exc:
        print(f"dpq-spark ledger {args.action}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # stdout closed by the reader: main() ends quietly
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename is not None else ""
        print(f"dpq-spark ledger {args.action}: {exc.strerror or type(exc).__name__}{where}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
