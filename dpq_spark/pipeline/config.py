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
    check_granularity,
    check_positive_int,
    check_quantiles,
)
from dpq_spark.core.errors import DPQValueError
from dpq_spark.core.randomness.grid import Grid
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
    """Where the private data is: a CSV or Parquet path, or a table name, and which columns.

    ``schema`` (CSV only) holds the declared column types as ``(name, type)`` pairs, each type
    a Spark type name (``"double"``, ``"decimal(10,2)"``, ``"string"``...). With
    ``schema_complete`` (``input.schema`` given as a DDL string) it is the whole file's schema
    in column order and the header's names are not used; otherwise (a table of types) it gives
    the types of the named header columns and every other column is read as a string.
    """

    format: str
    column: str
    path: str | None = None
    table: str | None = None
    group_by: tuple[str, ...] = ()
    csv_mode: str = "DROPMALFORMED"
    csv_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    schema: tuple[tuple[str, str], ...] = ()
    schema_complete: bool = False


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
    granularity: float | None = None  # None: the column type's grid (dp_quantiles' rule)


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    """Where the release goes: a directory (``path``), a table (``table``), or both.
    ``mode="error"`` refuses to replace an earlier release at ``path``; a table is appended to,
    one release per run."""

    path: str | None
    format: str = "parquet"
    mode: str = "error"
    table: str | None = None

    @property
    def where(self) -> str:
        """Where the release goes, in words."""
        parts = [] if self.path is None else [self.path]
        if self.table is not None:
            parts.append(f"table {self.table}")
        return " and ".join(parts)


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
            "granularity": r.granularity,
        }


# ---------------------------------------------------------------------------------------------
# Loading and overrides
# ---------------------------------------------------------------------------------------------

_SECTIONS: dict[str, tuple[str, ...]] = {
    "job": ("name", "spark_properties", "run_id"),
    "input": ("format", "path", "table", "column", "group_by", "schema", "csv"),
    "groups": ("keys", "path", "format", "table"),
    "release": (
        "quantiles", "epsilon", "delta", "lower", "upper", "neighboring", "privacy_unit",
        "max_rows_per_unit", "max_groups_per_unit", "resolution", "mechanism", "bounds_share",
        "granularity",
    ),
    "output": ("path", "format", "mode", "table"),
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

    The key may reach into a table of the section: ``input.csv.mode=FAILFAST`` returns
    ``("input", "csv.mode", "FAILFAST")``, which :func:`load_config` applies to
    ``[input.csv]``, keeping the table's other keys.

    Raises
    ------
    ConfigError
        If ``text`` is not of the form ``section.key=value`` (or ``section.table.key=value``).
    """
    key, sep, raw = text.partition("=")
    parts = [p.strip() for p in key.strip().split(".")]
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(f"an override must look like `section.key=value`, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return parts[0], ".".join(parts[1:]), value


def _apply_override(raw: dict, section: str, key: str, value: Any) -> None:
    """Set ``raw[section][key]``; a dotted ``key`` (``csv.mode``) walks into nested tables,
    creating the missing ones."""
    target = raw.setdefault(section, {})
    if not isinstance(target, dict):
        raise ConfigError(f"`{section}` must be a table (a [{section}] section)")
    *tables, last = key.split(".")
    where = section
    for name in tables:
        where += "." + name
        target = target.setdefault(name, {})
        if not isinstance(target, dict):
            raise ConfigError(f"`{where}` must be a table to override `{section}.{key}`")
    target[last] = value


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
        _apply_override(raw, section, key, value)
        if section == "ledger" and key in ("url", "path"):  # a flag replaces the file's ledger
            raw[section].pop("path" if key == "url" else "url", None)
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
        _fail("`input.csv` must be a table of CSV reader options")
    if csv and fmt != "csv":
        _fail(f"`input.csv` options are only for `input.format` 'csv', got {fmt!r}")
    csv = dict(csv)
    mode = _choice(csv, "input.csv", "mode", CSV_MODES, default="DROPMALFORMED", upper=True)
    csv.pop("mode", None)
    options = _csv_options(csv)
    schema, complete = (), False
    if "schema" in sec:
        if fmt != "csv":
            _fail(f"`input.schema` is only for `input.format` 'csv': a {fmt} input has its "
                  "own column types")
        schema, complete = _parse_schema(sec["schema"])
    if fmt == "csv":
        _check_csv_types(schema, complete, column, group_by)
        if options.get("header") is False and not complete:
            _fail("`input.csv.header = false` needs `input.schema` as a DDL string naming every "
                  "column in order: without a header line, the names and the number of columns "
                  "would come from the first data row")
    return InputConfig(format=fmt, column=column, path=path, table=table, group_by=group_by,
                       csv_mode=mode, csv_options=options, schema=schema,
                       schema_complete=complete)


def _single_char(value) -> bool:
    return isinstance(value, str) and len(value) <= 1


def _nonempty(value) -> bool:
    return isinstance(value, str) and value != ""


#: The CSV reader options a job may set: name -> (check, what the value must be, meaning).
#: Everything else is refused: an option that the analyst chooses and that makes reading fail or
#: succeed depending on the data asks the data a question outside any mechanism.
CSV_OPTIONS: dict[str, tuple[Any, str, str]] = {
    "header": (lambda v: isinstance(v, bool), "true or false",
               "the first line holds the column names (default true); it is skipped"),
    "sep": (_nonempty, "a non-empty string", "the field separator (default \",\")"),
    "encoding": (_nonempty, "a charset name", "the file's charset (default UTF-8)"),
    "quote": (_single_char, "one character, or \"\" for none",
              "the quote character (default '\"')"),
    "escape": (_single_char, "one character", "the escape character inside quotes (default \\)"),
    "nullValue": (lambda v: isinstance(v, str), "a string",
                  "the text of a null field (default the empty string)"),
    "nanValue": (_nonempty, "a non-empty string", "the text of NaN in a number column"),
    "positiveInf": (_nonempty, "a non-empty string", "the text of +infinity"),
    "negativeInf": (_nonempty, "a non-empty string", "the text of -infinity"),
    "ignoreLeadingWhiteSpace": (lambda v: isinstance(v, bool), "true or false",
                                "strip spaces before each field"),
    "ignoreTrailingWhiteSpace": (lambda v: isinstance(v, bool), "true or false",
                                 "strip spaces after each field"),
    "dateFormat": (_nonempty, "a non-empty string", "the pattern of date columns"),
    "timestampFormat": (_nonempty, "a non-empty string", "the pattern of timestamp columns"),
    "locale": (_nonempty, "a language tag", "the locale of dates and numbers (default en-US)"),
}

#: Options refused with their reason (the rest of Spark's options are refused as unknown).
CSV_REFUSED: dict[str, str] = {
    "delimiter": "use `input.csv.sep`",
    "charset": "use `input.csv.encoding`",
    "schema": "declare the types in `input.schema`",
    "inferSchema": "types come from `input.schema`, never from the data",
    "samplingRatio": "types come from `input.schema`, never from the data",
    "enforceSchema": "the job applies `input.schema` as declared",
    "preferDate": "types come from `input.schema`, never from the data",
    "columnNameOfCorruptRecord": "it would copy raw rows into a column",
    "comment": "it skips lines by their content (the header line too, so a data row becomes "
               "the column names)",
    "maxCharsPerColumn": "it fails a row by the length of a field: a question about the data",
    "maxColumns": "it fails a row by its number of fields: a question about the data",
    "multiLine": "a record must be one line: with it, one record's open quote can swallow the "
                 "records after it",
    "lineSep": "a record must be one line (the unit of privacy)",
}


def _csv_options(csv: dict) -> dict[str, Any]:
    """``input.csv`` (without ``mode``) checked against :data:`CSV_OPTIONS`."""
    for key, value in csv.items():
        if key in CSV_REFUSED:
            _fail(f"`input.csv.{key}` is not allowed: {CSV_REFUSED[key]}")
        if key not in CSV_OPTIONS:
            _fail(f"unknown key `input.csv.{key}`; the CSV options are mode, "
                  + ", ".join(CSV_OPTIONS) + " (see docs/jobs.md)")
        check, rule, _ = CSV_OPTIONS[key]
        if not check(value):
            _fail(f"`input.csv.{key}` must be {rule}, got {value!r}")
    return csv


_INTEGRAL_TYPES = {"tinyint": "tinyint", "byte": "tinyint", "smallint": "smallint",
                   "short": "smallint", "int": "int", "integer": "int", "bigint": "bigint",
                   "long": "bigint"}
_FLOAT_TYPES = {"float": "float", "real": "float", "double": "double"}
_OTHER_TYPES = {"string": "string", "boolean": "boolean", "date": "date",
                "timestamp": "timestamp"}
_DECIMAL = re.compile(r"(?:decimal|dec|numeric)(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?")
_DDL_NAME = re.compile(r"\s*(?:`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*))\s+(.+?)\s*")


def _spark_type(text, where: str) -> str:
    """A column type of ``input.schema`` as Spark's simple string (``"decimal(10,2)"``)."""
    if not isinstance(text, str):
        _fail(f"`{where}` must be a type name such as \"double\", got {text!r}")
    name = text.strip().lower()
    for table in (_INTEGRAL_TYPES, _FLOAT_TYPES, _OTHER_TYPES):
        if name in table:
            return table[name]
    match = _DECIMAL.fullmatch(name)
    if match:
        precision = int(match.group(1) or 10)
        scale = int(match.group(2) or 0)
        if not 1 <= precision <= 38 or scale > precision:
            _fail(f"`{where}`: decimal precision must be in 1..38 and the scale at most the "
                  f"precision, got {text!r}")
        return f"decimal({precision},{scale})"
    _fail(f"`{where}` must be one of tinyint, smallint, int, bigint, float, double, "
          f"decimal(p,s), string, boolean, date, timestamp, got {text!r}")


def _is_numeric_type(name: str) -> bool:
    """Whether a type of :func:`_spark_type` is a number type (integral, float, decimal)."""
    return (name in _INTEGRAL_TYPES.values() or name in _FLOAT_TYPES.values()
            or name.startswith("decimal("))


def _split_ddl(text: str) -> list[str]:
    """Split a DDL string at the commas outside parentheses and backquotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _parse_schema(value) -> tuple[tuple[tuple[str, str], ...], bool]:
    """``input.schema``: a DDL string (every column, in order) or a table of types by name."""
    if isinstance(value, str):
        fields = []
        for part in _split_ddl(value):
            match = _DDL_NAME.fullmatch(part)
            if not match:
                _fail(f"`input.schema` must be a DDL string such as \"id BIGINT, score "
                      f"DOUBLE\" (a name and a type per column), got {value!r}")
            name = match.group(1) or match.group(2)
            fields.append((name, _spark_type(match.group(3), f"input.schema` type of `{name}")))
        complete = True
    elif isinstance(value, dict) and value:
        fields = [(name, _spark_type(kind, f"input.schema.{name}")) for name, kind in value.items()]
        complete = False
    else:
        _fail("`input.schema` must be a DDL string (\"id BIGINT, score DOUBLE, ...\", every "
              "column in order) or a table of types by column name ({ score = \"double\" }), "
              f"got {value!r}")
    names = [n for n, _ in fields]
    if len(set(names)) != len(names):
        _fail("`input.schema` must not repeat a column")
    return tuple(fields), complete


def _check_csv_types(schema, complete: bool, column: str, group_by: tuple[str, ...]) -> None:
    """The CSV rule, from the configuration alone: the value column's type is declared and is a
    number type; with a complete schema every named column is in it."""
    types = dict(schema)
    if column not in types:
        _fail(f"`input.schema` must declare the type of `input.column` {column!r}: a CSV has no "
              "types and the job never guesses them from the data; e.g. `input.schema = { "
              f"{column} = \"double\" }}`")
    if not _is_numeric_type(types[column]):
        _fail(f"`input.schema` declares `input.column` {column!r} as {types[column]}; the "
              "release needs a number type (tinyint, smallint, int, bigint, float, double, "
              "decimal)")
    if complete:
        for name in group_by:
            if name not in types:
                _fail(f"`input.group_by` names column {name!r}, which is not in `input.schema`")


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
    granularity = _parse_granularity(sec.get("granularity"), lower, upper)
    return ReleaseConfig(quantiles=quantiles, epsilon=epsilon, delta=delta, lower=lower,
                         upper=upper, neighboring=neighboring, privacy_unit=unit,
                         max_rows_per_unit=rows, max_groups_per_unit=groups,
                         resolution=resolution, mechanism=mechanism, bounds_share=bounds_share,
                         granularity=granularity)


def _parse_granularity(value, lower, upper) -> float | None:
    """``release.granularity``: finite and > 0, and with bounds at most 2**32 steps between
    them (the rule of ``dp_quantiles``, checked before any job). Left out, the column type's
    grid applies (integers, a decimal's scale; none for float/double)."""
    if value is None:
        return None
    g = _wrap(check_granularity, value, name="release.granularity")
    if lower is not None:
        try:
            steps = Grid(lower, upper, g).steps
        except ValueError as exc:  # the core's rule, at most 2**52 steps
            raise ConfigError(str(exc).replace("`granularity`", "`release.granularity`")) from None
        if steps > 2**32:
            _fail(f"`release.granularity` must give at most 2**32 steps between "
                  f"`release.lower` and `release.upper`, got {g!r} on [{lower!r}, {upper!r}]")
    return g


_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}")


def _parse_output(sec: dict, now: _dt.datetime) -> OutputConfig:
    table = _string(sec, "output", "table")
    if table is not None and not _TABLE_NAME.fullmatch(table):
        _fail(f"`output.table` must be a table name such as `releases` or "
              f"`catalog.schema.releases` (letters, digits, underscores), got {table!r}")
    path = _string(sec, "output", "path")
    if path is None and table is None:
        _fail("[output] needs `output.path` (a directory), `output.table` (a table), or both")
    if path is not None:
        stamp = (now.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
                 + "-" + secrets.token_hex(3))
        try:
            path = _resolve_path(path.format(timestamp=stamp))
        except (KeyError, IndexError, ValueError):
            _fail(f"`output.path` may only use the placeholder {{timestamp}}, got {path!r}")
    fmt = _choice(sec, "output", "format", OUTPUT_FORMATS, default="parquet")
    mode = _choice(sec, "output", "mode", OUTPUT_MODES + ("errorifexists",), default="error")
    return OutputConfig(path=path, format=fmt, mode="error" if mode == "errorifexists" else mode,
                        table=table)


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

