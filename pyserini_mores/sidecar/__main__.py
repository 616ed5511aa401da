"""``python -m pyserini_mores.sidecar {info,verify,build}``: inspect, check and build sidecars.

``info`` and ``verify`` need neither torch nor the JVM; ``build`` imports :mod:`.build` only when it is the command.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from .format import TOKENS, Manifest, SidecarError, check_directory, read_manifest, short_hash, size_problems


def build_parser(with_build: bool = False) -> argparse.ArgumentParser:
    """The CLI parser; the ``build`` options are added only when ``with_build`` (they import the build module)."""
    parser = argparse.ArgumentParser(prog="python -m pyserini_mores.sidecar",
                                     description="Inspect, verify and build pyserini_mores sidecars.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{info,verify,build}")
    info = commands.add_parser("info", help="summarize a sidecar (reads the manifest only)")
    info.add_argument("path", help="sidecar directory")
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")
    verify = commands.add_parser("verify", help="check sizes, checksums, offsets and docid tables")
    verify.add_argument("path", help="sidecar directory")
    build = commands.add_parser("build", help="encode a collection into a sidecar (`build --help` for options)")
    if with_build:
        from .build import define_build_args

        define_build_args(build)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 problems found, 2 error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_build = bool(argv) and argv[0] == "build"
    try:
        parser = build_parser(with_build=wants_build)
    except ImportError as error:
        print(f"error: the build command is unavailable: {error}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            return _info(args)
        if args.command == "verify":
            return _verify(args)
        from .build import run_build

        result = run_build(args)
        return result if isinstance(result, int) else 0
    except (SidecarError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _info(args: argparse.Namespace) -> int:
    check_directory(args.path)
    manifest = read_manifest(args.path)
    if args.json:
        print(json.dumps(manifest.to_dict(), indent=2))
    else:
        print(format_summary(manifest, args.path))
    problems = size_problems(manifest, args.path)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _verify(args: argparse.Namespace) -> int:
    from .verify import verify_sidecar

    problems = verify_sidecar(args.path)
    if not problems:
        print(f"OK {args.path}")
        return 0
    print(f"{len(problems)} problem(s) in {args.path}:")
    for problem in problems:
        print(f"  {problem}")
    return 1


def format_summary(manifest: Manifest, path: str | Path) -> str:
    """A readable multi-line summary of a manifest."""
    model = manifest.model
    tokens_bytes = manifest.files[TOKENS].bytes
    total_bytes = sum(entry.bytes for entry in manifest.files.values())
    docs = max(1, manifest.num_docs)
    extra_model = {k: v for k, v in model.items() if k not in ("model_type", "store_variant", "fingerprint")}
    lines = [
        f"sidecar     {path}",
        f"format      {manifest.format} v{manifest.format_version}, created {manifest.created or '?'}"
        f" by {manifest.library.get('name', '?')} {manifest.library.get('version', '')}".rstrip(),
        f"model       {model.get('model_type')} (variant {model.get('store_variant')}), "
        f"fingerprint {short_hash(manifest.model_fingerprint)}",
    ]
    if extra_model:
        lines.append(f"            {_pairs(extra_model)}")
    lines += [
        f"vectors     dim {manifest.dim}, {manifest.dtype}",
        f"documents   {manifest.num_docs:,} ({manifest.num_tokens:,} tokens, "
        f"{manifest.num_tokens / docs:.1f} tokens/doc)",
        f"size        {_human(total_bytes)} ({tokens_bytes / docs:,.0f} bytes/doc of vectors)",
        f"index       {_pairs(manifest.index)}",
        f"build       {_pairs(manifest.build) or '-'}",
    ]
    return "\n".join(lines)


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{key}={json.dumps(value) if isinstance(value, (dict, list)) else value}"
                     for key, value in values.items())


def _human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if num_bytes < 1024 or unit == "TiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


if __name__ == "__main__":
    sys.exit(main())
