"""`flexmig migrate-config FILE`: turn a HAMi device config (knownMigGeometries) into chart values.

The values go to stdout (or `--output FILE`) as YAML for `helm install -f`; the report (every change,
every name that could not be mapped, every key not carried over) goes to stderr. Bad input: one line
naming the path on stderr, exit 1; nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    out = yaml.safe_dump(result.values, sort_keys=False, default_flow_style=None)
    header = f"# flexmig chart values migrated from {args.file} by `flexmig migrate-config`\n"
    if args.output == "-":
        sys.stdout.write(header + out)
    else:
        try:
            Path(args.output).write_text(header + out, encoding="utf-8")
        except OSError as exc:
            print(f"flexmig migrate-config: cannot write {args.output}: {exc}", file=sys.stderr)
            return 1
    for line in result.changes:
        print(f"changed: {line}", file=sys.stderr)
    for line in result.unmapped:
        print(f"NOT MAPPED: {line}", file=sys.stderr)
    for key in result.not_carried:
        print(f"not carried over (no effect in flexmig): {key}", file=sys.stderr)
    return 0
