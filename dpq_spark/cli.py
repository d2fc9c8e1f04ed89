"""The ``dpq-spark`` command line (also a Databricks Python-wheel task entry point).

Subcommands::

    dpq-spark run --config conf/goodreads.toml [--epsilon 0.5 ...]   # the dp_quantiles job
    dpq-spark ledger show --dataset goodreads_books (--config FILE | --ledger PATH) [--json]
    dpq-spark ledger set-cap --dataset ID --epsilon-cap 10 [--delta-cap 1e-6] (--config | --ledger)

``run`` takes exactly the flags of ``jobs/dp_quantiles.py`` (see :func:`dpq_spark.job.main`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

__all__ = ["main"]


def _ledger_from(args: argparse.Namespace):
    from dpq_spark.config import ConfigError, _local, tomllib
    from dpq_spark.ledger import Ledger

    path = args.ledger
    if path is None and args.config is not None:
        try:
            with open(args.config, "rb") as fh:
                path = tomllib.load(fh).get("ledger", {}).get("path")
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read the ledger path from {args.config!r}: {exc}") from None
        if path is None:
            raise ConfigError(f"{args.config!r} has no `ledger.path`")
    if path is None:
        raise ConfigError("give the ledger with --ledger PATH or --config FILE")
    return Ledger(_local(path))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _show(args: argparse.Namespace) -> int:
    ledger = _ledger_from(args)
    records = ledger.records(args.dataset)
    usage = ledger.usage(args.dataset)
    if args.json:
        print(json.dumps({
            "dataset_id": args.dataset,
            "usage": {**dataclasses.asdict(usage), "epsilon_remaining": usage.epsilon_remaining,
                      "delta_remaining": usage.delta_remaining},
            "records": [dataclasses.asdict(r) for r in records],
        }, indent=2))
        return 0
    print(f"ledger {ledger.path}")
    print(f"dataset {args.dataset!r}: epsilon spent {usage.epsilon_spent:g} of cap "
          f"{_fmt(usage.epsilon_cap)} (left {_fmt(usage.epsilon_remaining)}); delta spent "
          f"{usage.delta_spent:g} of cap {_fmt(usage.delta_cap)}")
    if not records:
        print("no records")
        return 0
    header = ("id", "status", "epsilon", "delta", "mechanism", "reserved_at (UTC)", "job", "output")
    rows = [(str(r.id), r.status, f"{r.epsilon:g}", f"{r.delta:g}", r.mechanism, r.reserved_at,
             r.job or "", r.output or (r.note or "")) for r in records]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _set_cap(args: argparse.Namespace) -> int:
    ledger = _ledger_from(args)
    ledger.set_cap(args.dataset, epsilon_cap=args.epsilon_cap, delta_cap=args.delta_cap)
    print(f"dataset {args.dataset!r}: epsilon_cap={args.epsilon_cap:g}, delta_cap={args.delta_cap:g}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dpq-spark", description="Differentially private quantiles "
                                "on Spark: run the release job and inspect the privacy ledger.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the dp_quantiles job (flags: dpq-spark run --help)",
                   add_help=False)
    led = sub.add_parser("ledger", help="inspect or administer the privacy ledger")
    led_sub = led.add_subparsers(dest="action", required=True)
    for name, helptext in (("show", "print the records and budget of a dataset"),
                           ("set-cap", "set a dataset's budget caps (the only way to raise them)")):
        q = led_sub.add_parser(name, help=helptext)
        q.add_argument("--dataset", required=True, help="the dataset id")
        where = q.add_mutually_exclusive_group()
        where.add_argument("--ledger", help="the SQLite ledger file")
        where.add_argument("--config", help="a job config whose `ledger.path` to use")
        if name == "show":
            q.add_argument("--json", action="store_true", help="print JSON")
        else:
            q.add_argument("--epsilon-cap", type=float, required=True)
            q.add_argument("--delta-cap", type=float, default=0.0)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dpq-spark`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        from dpq_spark.job import main as job_main

        return job_main(argv[1:], prog="dpq-spark run")
    args = build_parser().parse_args(argv)
    from dpq_spark.config import ConfigError
    from dpq_spark.ledger import LedgerError

    try:
        return _show(args) if args.action == "show" else _set_cap(args)
    except (ConfigError, LedgerError) as exc:
        print(f"dpq-spark ledger: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
