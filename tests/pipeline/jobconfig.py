"""One job config writer for the pipeline tests (importable: tests/pipeline/conftest.py puts
this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path


def write_job_config(path: Path, *, data, column: str, output, ledger_url: str,
                     dataset_id: str, epsilon, quantiles: str = "[0.5]",
                     group_by: list[str] | None = None, keys: list[str] | None = None,
                     bounds: str = "lower = 0.0\nupper = 10.0", output_format: str = "csv",
                     mode: str | None = None, cap=None, create: bool | None = None,
                     extra: str = "", column_type: str | None = "double") -> str:
    """Write a CSV-input job config to ``path`` and return its path as a string
    (``column_type``: the value column's type in ``input.schema``; None: no schema)."""
    lines = ["[input]", 'format = "csv"', f'path = "{data}"', f'column = "{column}"']
    if column_type is not None:
        lines.append(f'schema = {{ "{column}" = "{column_type}" }}')
    if group_by is not None:
        lines.append("group_by = [" + ", ".join(f'"{g}"' for g in group_by) + "]")
    if keys is not None:
        lines += ["", "[groups]", "keys = [" + ", ".join(f'"{k}"' for k in keys) + "]"]
    lines += ["", "[release]", f"quantiles = {quantiles}", f"epsilon = {epsilon}", bounds,
              "", "[output]", f'path = "{output}"', f'format = "{output_format}"']
    if mode is not None:
        lines.append(f'mode = "{mode}"')
    lines += ["", "[ledger]", f'url = "{ledger_url}"', f'dataset_id = "{dataset_id}"']
    if cap is not None:
        lines.append(f"epsilon_cap = {cap}")
    if create is not None:
        lines.append(f"create = {'true' if create else 'false'}")
    Path(path).write_text("\n".join(lines) + "\n" + extra)
    return str(path)
