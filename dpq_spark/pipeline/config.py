"""TOML configuration of the dp_quantiles job: load, override, validate.

A job configuration is one TOML file with the sections ``[job]``, ``[input]``, ``[groups]``,
``[release]``, ``[output]`` and ``[ledger]`` (see ``docs/jobs.md`` and the examples under
``conf/``). Command-line flags override single keys (``--set release.epsilon=0.5``). Everything
is validated here, before the job touches the ledger or any data; every problem raises
:class:`ConfigError`, whose message names the key (``release.epsilon``), states the rule and
echoes the offending public value.

Spark settings do not belong here: they go to ``spark-submit --conf`` or a
``conf/spark-*.conf`` properties file. A ``[spark]`` section is refused on purpose.

Relative local paths (no URI scheme) written in the file are resolved against the directory of
the file, so that a job started from another directory reads and charges the same things; paths
given by flags (``--input``, ``--ledger``, ``--set ...``) are resolved against the current working
directory. Both become absolute when the configuration is loaded, so that driver and executors
agree on them.

The ledger is ``ledger.url`` (``sqlite:///ABS/PATH``, ``postgresql://user@host/db``) or
``ledger.path`` (a SQLite file). A PostgreSQL URL must not carry a password: it comes from the
environment (``PGPASSWORD``, ``PGPASSFILE``) or ``ledger.password_file``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import numbers
import os
import re
import secrets
import sys
from typing import Any

from dpq_spark.core._validation import (
    check_bounds,
    check_delta,
    check_epsilon,
    check_positive_int,
    check_quantiles,
)
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.accounting.neighboring import NeighboringRelation
from dpq_spark.pipeline.ledger.base import is_postgres_url, redact_url, url_has_password

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "ConfigError",
    "JobConfig",
    "InputConfig",
    "GroupsConfig",
    "ReleaseConfig",
    "OutputConfig",
    "LedgerConfig",
    "QUANTILE_SHORTHANDS",
    "load_config",
    "parse_config",
    "parse_override",
    "quantiles_from_text",
    "is_local_path",
    "ledger_url",
    "read_raw",
]


class ConfigError(DPQValueError):
    """The job configuration breaks a documented rule; nothing was read, reserved or written."""


def _evenly_spaced(m: int) -> tuple[float, ...]:
    return tuple(k / (m + 1) for k in range(1, m + 1))


#: Named quantile lists accepted by ``release.quantiles``.
QUANTILE_SHORTHANDS: dict[str, tuple[float, ...]] = {
    "median": (0.5,),
    "quartiles": (0.25, 0.5, 0.75),
    "deciles": _evenly_spaced(9),
    "percentiles": _evenly_spaced(99),
}

INPUT_FORMATS = ("csv", "parquet", "table")
KEY_FORMATS = ("csv", "parquet", "json")
OUTPUT_FORMATS = ("parquet", "csv", "json")
OUTPUT_MODES = ("error", "overwrite")
CSV_MODES = ("DROPMALFORMED", "PERMISSIVE", "FAILFAST")
MAX_RESOLUTION = 2**30


def _mechanisms() -> tuple[str, ...]:
    """Mechanism names ``dp_quantiles`` accepts: JointExp and the pure-DP baselines of the core
    registry (the same rule as ``dpq_spark.spark._mechanisms``, without importing pyspark)."""
    names = ["joint_exp"]
    try:
        from dpq_spark.core.quantiles import mechanisms as registry
    except ModuleNotFoundError:  # pragma: no cover - the registry is optional
        return tuple(names)
    guarantees = getattr(registry, "GUARANTEES", {})
    names += sorted(n for n in registry.MECHANISMS
                    if n != "joint_exp" and guarantees.get(n, "pure") == "pure")
    return tuple(names)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def is_local_path(path: str) -> bool:
    """True when ``path`` is on the local file system (no URI scheme, or ``file:``)."""
    return not _SCHEME.match(path) or path.startswith("file:")


def _local(path: str) -> str:
    """Strip a ``file:`` scheme and make a local path absolute."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif path.startswith("file:"):
        path = path[len("file:"):]
    return os.path.abspath(os.path.expanduser(path))


def _resolve_path(path: str) -> str:
    return _local(path) if is_local_path(path) else path


# ---------------------------------------------------------------------------------------------
# The validated configuration
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InputConfig:
    """Where the private data is: a CSV or Parquet path, or a table name, and which columns."""

    format: str
    column: str
    path: str | None = None
    table: str | None = None
    group_by: tuple[str, ...] = ()
    csv_mode: str = "DROPMALFORMED"
    csv_options: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GroupsConfig:
    """The public group keys: an inline list, a file, or a table (exactly one of them)."""

    keys: tuple[tuple[Any, ...], ...] | None = None
    path: str | None = None
    format: str = "csv"
    table: str | None = None


@dataclasses.dataclass(frozen=True)
class ReleaseConfig:
    """The public parameters of the DP release; passed to ``dp_quantiles`` as they are."""

    quantiles: tuple[float, ...]
    epsilon: float
    lower: float | None = None  # both None: private bounds bought with bounds_share of epsilon
    upper: float | None = None
    delta: float | None = None
    neighboring: str = "add_remove"
    privacy_unit: str | None = None
    max_rows_per_unit: int = 1
    max_groups_per_unit: int = 1
    resolution: int | None = 2**20  # None without bounds (a fixed public log-scale grid)
    mechanism: str = "auto"
    bounds_share: float | None = None  # without bounds only; None: the default 0.2


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    """Where the release goes. ``mode="error"`` refuses to replace an earlier release."""

    path: str
    format: str = "parquet"
    mode: str = "error"


@dataclasses.dataclass(frozen=True)
class LedgerConfig:
    """The privacy ledger (a URL without password), the dataset and, optionally, its caps.

    The caps belong to the ledger (``dpq-spark ledger init`` and ``set-cap`` store them). A cap
    given here may only lower the stored one for this job's runs; ``None`` means the stored cap.
    ``create`` lets the job create the ledger and the dataset's budget when they do not exist
    yet (its first run, which then needs ``epsilon_cap``); by default a missing ledger or
    dataset is an error.
    """

    url: str
    dataset_id: str
    epsilon_cap: float | None = None
    delta_cap: float | None = None
    create: bool = False
    password_file: str | None = None

    @property
    def name(self) -> str:
        """The URL without password, for logs and messages."""
        return redact_url(self.url)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """A complete, validated job configuration."""

    name: str
    input: InputConfig
    groups: GroupsConfig | None
    release: ReleaseConfig
    output: OutputConfig
    ledger: LedgerConfig
    spark_properties: str | None = None
    source: str | None = None
    run_id: str | None = None  # the run's logical date or id: names its release in the ledger

    @property
    def release_name(self) -> str | None:
        """The ledger name of this run's release (``"<job.name> <run_id>"``), if it has one."""
        return None if self.run_id is None else f"{self.name} {self.run_id}"

    def public_parameters(self) -> dict[str, Any]:
        """The public parameters of the run, safe to log and to store in the ledger."""
        r = self.release
        return {
            "job": self.name,
            "input": self.input.path or self.input.table,
            "input_format": self.input.format,
            "column": self.input.column,
            "group_by": list(self.input.group_by),
            "quantiles": list(r.quantiles),
            "epsilon": r.epsilon,
            "delta": r.delta,
            "lower": r.lower,
            "upper": r.upper,
            "neighboring": r.neighboring,
            "privacy_unit": r.privacy_unit,
            "max_rows_per_unit": r.max_rows_per_unit,
            "max_groups_per_unit": r.max_groups_per_unit,
            "resolution": r.resolution,
            "mechanism": r.mechanism,
            "bounds_share": r.bounds_share,
        }


# ---------------------------------------------------------------------------------------------
# Loading and overrides
# ---------------------------------------------------------------------------------------------

_SECTIONS: dict[str, tuple[str, ...]] = {
    "job": ("name", "spark_properties", "run_id"),
    "input": ("format", "path", "table", "column", "group_by", "csv"),
    "groups": ("keys", "path", "format", "table"),
    "release": (
        "quantiles", "epsilon", "delta", "lower", "upper", "neighboring", "privacy_unit",
        "max_rows_per_unit", "max_groups_per_unit", "resolution", "mechanism", "bounds_share",
    ),
    "output": ("path", "format", "mode"),
    "ledger": ("url", "path", "dataset_id", "epsilon_cap", "delta_cap", "create",
               "password_file"),
}

# Keys whose values are local paths, resolved against the config file's directory.
_PATH_KEYS = (("job", "spark_properties"), ("input", "path"), ("groups", "path"),
              ("output", "path"), ("ledger", "path"), ("ledger", "password_file"))


def _relative_to(base: str, raw: dict) -> None:
    """Make relative local paths of ``raw`` (as read from a file in ``base``) absolute."""
    for sec, key in _PATH_KEYS:
        body = raw.get(sec)
        if isinstance(body, dict) and isinstance(body.get(key), str):
            value = body[key]
            if is_local_path(value) and not value.startswith("file:"):
                body[key] = os.path.join(base, os.path.expanduser(value))
    body = raw.get("ledger")
    if isinstance(body, dict) and isinstance(body.get("url"), str) and \
            not _SCHEME.match(body["url"]):  # a plain path given as url
        body["url"] = os.path.join(base, os.path.expanduser(body["url"]))


def read_raw(path: str) -> dict:
    """The TOML file ``path`` as a dict, its relative paths resolved against its directory.

    Raises
    ------
    ConfigError
        If the file is missing or not valid TOML.
    """
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path!r} is a directory") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None
    _relative_to(os.path.dirname(os.path.abspath(path)), raw)
    return raw


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse one ``section.key=value`` override; the value is read as a TOML value when it is
    one (``0.5``, ``true``, ``["a", "b"]``) and as a plain string otherwise.

    Raises
    ------
    ConfigError
        If ``text`` is not of the form ``section.key=value``.
    """
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ConfigError(f"an override must look like `section.key=value`, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return parts[0], parts[1], value


def load_config(path: str, overrides: list[tuple[str, str, Any]] | None = None,
                *, now: _dt.datetime | None = None) -> JobConfig:
    """Read a TOML job configuration, apply overrides, and validate it.

    Parameters
    ----------
    path : str
        The TOML file.
    overrides : list of (section, key, value), optional
        Values that replace (or add) single keys of the file, e.g. from command-line flags.
    now : datetime, optional
        The time substituted for ``{timestamp}`` in ``output.path`` (default: now, UTC); a
        random suffix is added so that two jobs started together never share a path.

    Returns
    -------
    JobConfig

    Raises
    ------
    ConfigError
        If the file is missing or not valid TOML, or any value breaks a rule.
    """
    raw = read_raw(path)
    for section, key, value in overrides or ():
        target = raw.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"`{section}` must be a table (a [{section}] section)")
        target[key] = value
        if section == "ledger" and key in ("url", "path"):  # a flag replaces the file's ledger
            target.pop("path" if key == "url" else "url", None)
    return parse_config(raw, source=path, now=now)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _fail(message: str) -> None:
    raise ConfigError(message)


def _wrap(check, *args, **kwargs):
    """Run a core checker, turning its ValueError/TypeError into a ConfigError."""
    try:
        return check(*args, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def _string(section: dict, sec: str, key: str, *, required: bool = False,
            default: str | None = None) -> str | None:
    value = section.get(key, default)
    if value is None:
        if required:
            _fail(f"`{sec}.{key}` is required")
        return None
    if not isinstance(value, str) or not value.strip():
        _fail(f"`{sec}.{key}` must be a non-empty string, got {value!r}")
    return value


def _choice(section: dict, sec: str, key: str, allowed: tuple[str, ...], default: str | None,
            *, upper: bool = False) -> str:
    value = section.get(key, default)
    if value is None:
        _fail(f"`{sec}.{key}` is required (one of {', '.join(map(repr, allowed))})")
    norm = value.upper() if upper and isinstance(value, str) else value
    if norm not in allowed:
        _fail(f"`{sec}.{key}` must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return norm


def _real(section: dict, sec: str, key: str, *, required: bool = True) -> float | None:
    value = section.get(key)
    if value is None:
        if required:
            _fail(f"`{sec}.{key}` is required")
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(f"`{sec}.{key}` must be a number, got {value!r}")
    return float(value)


def _check_sections(raw: dict) -> None:
    if "spark" in raw:
        _fail("a [spark] section is not allowed: Spark settings belong in spark-submit --conf "
              "or a conf/spark-*.conf properties file (see `job.spark_properties`)")
    for sec, body in raw.items():
        if sec not in _SECTIONS:
            _fail(f"unknown section [{sec}]; expected one of {', '.join(_SECTIONS)}")
        if not isinstance(body, dict):
            _fail(f"`{sec}` must be a table (a [{sec}] section)")
        for key in body:
            if key not in _SECTIONS[sec]:
                _fail(f"unknown key `{sec}.{key}`; expected one of {', '.join(_SECTIONS[sec])}")
    for sec in ("input", "release", "output", "ledger"):
        if sec not in raw:
            _fail(f"section [{sec}] is required")


def _names(value, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        _fail(f"`{where}` must be a column name or a list of column names, got {value!r}")
    if len(set(value)) != len(value):
        _fail(f"`{where}` must not repeat a column, got {value!r}")
    return tuple(value)


def _parse_input(sec: dict) -> InputConfig:
    fmt = _choice(sec, "input", "format", INPUT_FORMATS, default=None)
    column = _string(sec, "input", "column", required=True)
    group_by = _names(sec.get("group_by", []), "input.group_by")
    if column in group_by:
        _fail(f"`input.column` {column!r} must not also be a group column")
    path, table = sec.get("path"), sec.get("table")
    if fmt == "table":
        table = _string(sec, "input", "table", required=True)
        if path is not None:
            _fail("`input.path` must not be set when `input.format` is 'table'")
    else:
        path = _string(sec, "input", "path", required=True)
        if table is not None:
            _fail(f"`input.table` must not be set when `input.format` is {fmt!r}")
        path = _resolve_path(path)
        if is_local_path(path) and not os.path.exists(path):
            _fail(f"`input.path` {path!r} does not exist")
    csv = sec.get("csv", {})
    if not isinstance(csv, dict):
        _fail("`input.csv` must be a table of Spark CSV reader options")
    if csv and fmt != "csv":
        _fail(f"`input.csv` options are only for `input.format` 'csv', got {fmt!r}")
    csv = dict(csv)
    mode = _choice(csv, "input.csv", "mode", CSV_MODES, default="DROPMALFORMED", upper=True)
    csv.pop("mode", None)
    for key in ("schema", "columnNameOfCorruptRecord"):
        if key in csv:
            _fail(f"`input.csv.{key}` is set by the job and must not be given")
    return InputConfig(format=fmt, column=column, path=path, table=table, group_by=group_by,
                       csv_mode=mode, csv_options=csv)


def _parse_groups(sec: dict | None, group_by: tuple[str, ...], has_delta: bool) -> GroupsConfig | None:
    if sec is None or not sec:
        if group_by and not has_delta:
            _fail("`input.group_by` needs public keys in [groups] (keys, path or table); keys "
                  "taken from the data would break differential privacy unless `release.delta` "
                  "is set for DP partition selection")
        return None
    if not group_by:
        _fail("[groups] is given but `input.group_by` is empty")
    given = [k for k in ("keys", "path", "table") if k in sec]
    if len(given) != 1:
        _fail(f"[groups] needs exactly one of `groups.keys`, `groups.path`, `groups.table`, got {given}")
    if "keys" in sec:
        keys = sec["keys"]
        if not isinstance(keys, list) or not keys:
            _fail("`groups.keys` must be a non-empty list of keys")
        rows = []
        for key in keys:
            row = tuple(key) if isinstance(key, list) else (key,)
            if len(row) != len(group_by):
                _fail(f"`groups.keys` entries must have {len(group_by)} value(s), one per "
                      f"`input.group_by` column, got {key!r}")
            if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in row):
                _fail(f"`groups.keys` values must be strings or numbers, got {key!r}")
            rows.append(row)
        if len(set(rows)) != len(rows):
            _fail("`groups.keys` must not repeat a key")
        return GroupsConfig(keys=tuple(rows))
    if "path" in sec:
        path = _resolve_path(_string(sec, "groups", "path", required=True))
        if is_local_path(path) and not os.path.exists(path):
            _fail(f"`groups.path` {path!r} does not exist")
        fmt = _choice(sec, "groups", "format", KEY_FORMATS, default="csv")
        return GroupsConfig(path=path, format=fmt)
    if "format" in sec:
        _fail("`groups.format` is only for `groups.path`")
    return GroupsConfig(table=_string(sec, "groups", "table", required=True))


def _parse_quantiles(value) -> tuple[float, ...]:
    if value is None:
        _fail("`release.quantiles` is required")
    if isinstance(value, str):
        if value.lower() not in QUANTILE_SHORTHANDS:
            _fail(f"`release.quantiles` must be a list of numbers or one of "
                  f"{', '.join(map(repr, QUANTILE_SHORTHANDS))}, got {value!r}")
        return QUANTILE_SHORTHANDS[value.lower()]
    if not isinstance(value, list) or not all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value
    ):
        _fail(f"`release.quantiles` must be a list of numbers or a shorthand, got {value!r}")
    q = _wrap(check_quantiles, value, name="release.quantiles")
    return tuple(float(v) for v in q)


def _parse_release(sec: dict) -> ReleaseConfig:
    quantiles = _parse_quantiles(sec.get("quantiles"))
    if "epsilon" not in sec:
        _fail("`release.epsilon` is required")
    epsilon = _wrap(check_epsilon, sec["epsilon"], name="release.epsilon")
    delta = sec.get("delta")
    if delta is not None:
        delta = _wrap(check_delta, delta, name="release.delta")
    if ("lower" in sec) != ("upper" in sec):
        _fail("`release.lower` and `release.upper` must both be given (public bounds chosen "
              "without looking at the data) or both be left out (bounds released privately)")
    if "lower" in sec:
        lower, upper = _wrap(check_bounds, sec["lower"], sec["upper"],
                             names=("release.lower", "release.upper"))
        if "bounds_share" in sec:
            _fail("`release.bounds_share` applies only without `release.lower`/`release.upper`")
        bounds_share = None
    else:
        lower = upper = None
        if "resolution" in sec:
            _fail("`release.resolution` applies only with `release.lower` and `release.upper`")
        bounds_share = sec.get("bounds_share")
        if bounds_share is not None and (
                not isinstance(bounds_share, numbers.Real) or isinstance(bounds_share, bool)
                or not 0.0 < float(bounds_share) < 1.0):
            _fail(f"`release.bounds_share` must be in (0, 1), got {bounds_share!r}")
        bounds_share = None if bounds_share is None else float(bounds_share)
    neighboring = _wrap(NeighboringRelation.parse, sec.get("neighboring", "add_remove"),
                        name="release.neighboring").value
    unit = _string(sec, "release", "privacy_unit")
    rows = _wrap(check_positive_int, sec.get("max_rows_per_unit", 1), "release.max_rows_per_unit")
    groups = _wrap(check_positive_int, sec.get("max_groups_per_unit", 1),
                   "release.max_groups_per_unit")
    if unit is None and ("max_rows_per_unit" in sec or "max_groups_per_unit" in sec):
        _fail("`release.max_rows_per_unit` and `release.max_groups_per_unit` need "
              "`release.privacy_unit`")
    resolution = None
    if lower is not None:
        resolution = _wrap(check_positive_int, sec.get("resolution", 2**20), "release.resolution", 2)
        if resolution > MAX_RESOLUTION:
            _fail(f"`release.resolution` must be <= 2**30, got {resolution!r}")
    mechanism = _choice(sec, "release", "mechanism", _mechanisms(), default="auto")
    return ReleaseConfig(quantiles=quantiles, epsilon=epsilon, delta=delta, lower=lower,
                         upper=upper, neighboring=neighboring, privacy_unit=unit,
                         max_rows_per_unit=rows, max_groups_per_unit=groups,
                         resolution=resolution, mechanism=mechanism, bounds_share=bounds_share)


def _parse_output(sec: dict, now: _dt.datetime) -> OutputConfig:
    path = _string(sec, "output", "path", required=True)
    stamp = (now.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
             + "-" + secrets.token_hex(3))
    try:
        path = path.format(timestamp=stamp)
    except (KeyError, IndexError, ValueError):
        _fail(f"`output.path` may only use the placeholder {{timestamp}}, got {path!r}")
    fmt = _choice(sec, "output", "format", OUTPUT_FORMATS, default="parquet")
    mode = _choice(sec, "output", "mode", OUTPUT_MODES + ("errorifexists",), default="error")
    return OutputConfig(path=_resolve_path(path), format=fmt,
                        mode="error" if mode == "errorifexists" else mode)


def ledger_url(sec: dict) -> str:
    """The ledger URL of a ``[ledger]`` section (``url``, or ``path`` for SQLite), validated."""
    given = [k for k in ("url", "path") if sec.get(k) is not None]
    if len(given) != 1:
        _fail(f"[ledger] needs exactly one of `ledger.url` and `ledger.path`, got {given}")
    key = given[0]
    value = _string(sec, "ledger", key, required=True)
    if key == "path":
        if not is_local_path(value):
            _fail(f"`ledger.path` must be a local SQLite file; give a server as `ledger.url`, "
                  f"got {redact_url(value)!r}")
        return "sqlite://" + _local(value)
    if is_postgres_url(value):
        if url_has_password(value):
            _fail(f"`ledger.url` must not contain a password ({redact_url(value)!r}): set "
                  "PGPASSWORD in the environment or name a file in `ledger.password_file`")
        return value
    if value.startswith("sqlite:"):
        if not value.startswith("sqlite:///"):
            _fail(f"`ledger.url` for SQLite must be sqlite:///ABSOLUTE/PATH, got {value!r}")
        return "sqlite://" + _local("/" + value[len("sqlite:"):].lstrip("/"))
    if _SCHEME.match(value) and not value.startswith("file:"):
        _fail(f"`ledger.url` must be sqlite:///PATH or postgresql://..., got {redact_url(value)!r}")
    return "sqlite://" + _local(value)


def _parse_ledger(sec: dict, delta: float | None) -> LedgerConfig:
    url = ledger_url(sec)
    create = sec.get("create", False)
    if not isinstance(create, bool):
        _fail(f"`ledger.create` must be true or false, got {create!r}")
    password_file = _string(sec, "ledger", "password_file")
    if password_file is not None:
        password_file = _local(password_file)
        if not url.startswith("postgres"):
            _fail("`ledger.password_file` is only for a PostgreSQL `ledger.url`")
        if not os.path.exists(password_file):
            _fail(f"`ledger.password_file` {password_file!r} does not exist")
    dataset_id = _string(sec, "ledger", "dataset_id", required=True)
    cap = _real(sec, "ledger", "epsilon_cap", required=False)
    if cap is None and create:
        _fail("`ledger.create = true` needs `ledger.epsilon_cap`: the cap of the budget it "
              "creates")
    if cap is not None and not (math.isfinite(cap) and cap > 0):
        _fail(f"`ledger.epsilon_cap` must be finite and > 0, got {sec['epsilon_cap']!r}")
    delta_cap = _real(sec, "ledger", "delta_cap", required=False)
    if delta_cap is not None and not (0.0 <= delta_cap < 1.0):
        _fail(f"`ledger.delta_cap` must be in [0, 1), got {sec['delta_cap']!r}")
    if delta is not None and delta_cap == 0.0:
        _fail("`release.delta` is set but `ledger.delta_cap` is 0: give the dataset a delta cap")
    return LedgerConfig(url=url, dataset_id=dataset_id, epsilon_cap=cap, delta_cap=delta_cap,
                        create=create, password_file=password_file)


def parse_config(raw: dict, *, source: str | None = None,
                 now: _dt.datetime | None = None) -> JobConfig:
    """Validate a configuration given as a dict (the parsed TOML) and return a :class:`JobConfig`.

    Raises
    ------
    ConfigError
        On the first rule that is broken, naming the key.
    """
    if not isinstance(raw, dict):
        _fail("the configuration must be a TOML table")
    _check_sections(raw)
    job = raw.get("job", {})
    name = _string(job, "job", "name", default="dp_quantiles")
    props = _string(job, "job", "spark_properties")
    run_id = _string(job, "job", "run_id")
    if run_id is not None and not run_id.strip():
        _fail("`job.run_id` must be a non-empty string")
    if props is not None:
        props = _local(props)
        if not os.path.exists(props):
            _fail(f"`job.spark_properties` {props!r} does not exist")
    inp = _parse_input(raw["input"])
    release = _parse_release(raw["release"])
    if release.privacy_unit in (inp.column, *inp.group_by):
        _fail(f"`release.privacy_unit` {release.privacy_unit!r} must not be the value column or "
              "a group column")
    # The rules dp_quantiles enforces on combinations, checked here so that the job never
    # spends budget on a release the library would refuse.
    if release.max_groups_per_unit != 1 and not inp.group_by:
        _fail("`release.max_groups_per_unit` applies only with `input.group_by`")
    if release.neighboring == "swap" and (inp.group_by or release.privacy_unit is not None):
        _fail("`release.neighboring = \"swap\"` is supported only without `input.group_by` and "
              "`release.privacy_unit`; use \"add_remove\"")
    if release.delta is not None and (not inp.group_by or raw.get("groups")):
        _fail("`release.delta` is only for DP partition selection: with `input.group_by` and "
              "without [groups]")
    groups = _parse_groups(raw.get("groups"), inp.group_by, release.delta is not None)
    output = _parse_output(raw["output"], now or _dt.datetime.now(_dt.timezone.utc))
    ledger = _parse_ledger(raw["ledger"], release.delta)
    return JobConfig(name=name, input=inp, groups=groups, release=release, output=output,
                     ledger=ledger, spark_properties=props, source=source, run_id=run_id)


def quantiles_from_text(text: str) -> list[float] | str:
    """Parse a ``--quantiles`` flag: a shorthand name or comma-separated numbers."""
    text = text.strip()
    if text.lower() in QUANTILE_SHORTHANDS:
        return text.lower()
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"`--quantiles` must be a shorthand or comma-separated numbers, "
                          f"got {text!r}") from None

