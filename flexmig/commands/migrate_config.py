"""`flexmig migrate-config FILE`: turn a HAMi device config (knownMigGeometries) into chart values.

The values go to stdout (or `--output FILE`) as YAML for `helm install -f`; the report (every change,
every name that could not be mapped, every key not carried over) goes to stderr. Bad input: one line
naming the path on stderr, exit 1; nothing is written.

A migration that cannot carry every profile name over is refused the same way (exit 1, each name that
could not be mapped with the names allowed instead, nothing written): applied, such values would quietly
allow less than HAMi did, e.g. no MIG at all on a model whose only name had a typo. `--allow-partial`
writes them anyway, and the values file then says at its top what was dropped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from flexmig.migrateconfig import MigrateError, migrate


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "migrate-config",
        help="turn a HAMi device config's knownMigGeometries into chart values (migProfileAllowlist)",
        description=(
            "Read a HAMi device config (YAML or JSON; the ConfigMap itself, its data map, or "
            "device-config.yaml) and write values for flexmig's chart: knownMigGeometries becomes "
            "deviceConfig.migProfileAllowlist (the union of profile names per model, checked against "
            "what each model offers), and defaultMemory, defaultCores, defaultGPUNum, deviceSplitCount, "
            "memoryFactor, the scalings and custom resource names are carried over. The report goes "
            "to stderr."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="the HAMi device config ('-' for stdin)")
    parser.add_argument("-o", "--output", default="-", help="where to write the values (default: stdout)")
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help=(
            "write the values even when some profile names could not be mapped (they are dropped, and "
            "listed in a comment at the top of the values); without it such a migration writes nothing"
        ),
    )
    parser.set_defaults(func=run)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    return Path(path).read_text(encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    try:
        text = _read(args.file)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"flexmig migrate-config: cannot read {args.file}: {exc}", file=sys.stderr)
        return 1
    try:
        doc = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        print(f"flexmig migrate-config: {args.file}: neither valid YAML nor JSON: {exc}", file=sys.stderr)
        return 1
    try:
        result = migrate(doc)
    except MigrateError as exc:
        print(f"flexmig migrate-config: {args.file}: {exc}", file=sys.stderr)
        return 1
    for line in result.changes:
        print(f"changed: {line}", file=sys.stderr)
    for line in result.unmapped:
        print(f"NOT MAPPED: {line}", file=sys.stderr)
    for key in result.not_carried:
        print(f"not carried over (no effect in flexmig): {key}", file=sys.stderr)
    if result.unmapped and not args.allow_partial:
        print(
            f"flexmig migrate-config: {args.file}: {len(result.unmapped)} entries could not be mapped "
            "(NOT MAPPED above); nothing written. Fix them in the input, or pass --allow-partial to "
            "write values without them",
            file=sys.stderr,
        )
        return 1
    return _write(args.output, _header(args.file, result.unmapped) + _dump(result.values))


def _dump(values: dict[str, Any]) -> str:
    return yaml.safe_dump(values, sort_keys=False, default_flow_style=None)


def _header(source: str, dropped: list[str]) -> str:
    header = f"# flexmig chart values migrated from {source} by `flexmig migrate-config`\n"
    if dropped:
        # In the file itself, so whoever applies it later sees it is partial (stderr is long gone).
        header += "# PARTIAL (--allow-partial): these could not be mapped and were dropped:\n"
        header += "".join(f"#   {' '.join(line.split())}\n" for line in dropped)
    return header


def _write(output: str, text: str) -> int:
    if output == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"flexmig migrate-config: cannot write {output}: {exc}", file=sys.stderr)
        return 1
    return 0
