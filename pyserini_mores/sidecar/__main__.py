"""``python -m pyserini_mores.sidecar {info,verify,build,assemble,transcode}``: inspect, check, build, assemble
and transcode sidecars.

``info``, ``verify``, ``assemble`` and ``transcode`` need neither torch nor the JVM (``transcode`` needs faiss for a
codec); ``build`` imports :mod:`.build` only when it is the command.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from .codecs import CODECS
from .format import (
    MANIFEST,
    TOKENS,
    Manifest,
    SidecarError,
    check_directory,
    read_manifest,
    short_hash,
    size_problems,
)
from .shards import ShardedManifest, is_sharded, read_sharded_manifest


def build_parser(with_build: bool = False) -> argparse.ArgumentParser:
    """The CLI parser; the ``build`` options are added only when ``with_build`` (they import the build module)."""
    parser = argparse.ArgumentParser(
        prog="python -m pyserini_mores.sidecar",
        description="Inspect, verify, build, assemble and transcode pyserini_mores sidecars.")
    commands = parser.add_subparsers(dest="command", required=True,
                                     metavar="{info,verify,build,assemble,transcode}")
    info = commands.add_parser("info", help="summarize a sidecar (reads the manifest only)")
    info.add_argument("path", help="sidecar directory")
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")
    verify = commands.add_parser("verify", help="check sizes, checksums, offsets and docid tables")
    verify.add_argument("path", help="sidecar directory (of a sharded sidecar: every shard is verified)")
    build = commands.add_parser("build", help="encode a collection into a sidecar (`build --help` for options)")
    if with_build:
        from .build import define_build_args

        define_build_args(build)
    assemble = commands.add_parser(
        "assemble", aliases=["merge"],
        help="join shards built with `build --shards N --shard I` into one sharded sidecar (no data copy)")
    assemble.add_argument("--output", required=True, help="directory of the sharded sidecar (its manifest only)")
    assemble.add_argument("shards", nargs="+", metavar="SHARD", help="shard directories, in any order")
    assemble.add_argument("--overwrite", action="store_true", help="replace an existing sharded manifest")
    transcode = commands.add_parser(
        "transcode", help="store a sidecar's vectors again with another codec or dtype, without the model")
    transcode.add_argument("source", help="the sidecar to read")
    transcode.add_argument("--output", required=True, help="directory of the new sidecar")
    transcode.add_argument("--codec", choices=CODECS, default="fp16",
                           help="fp16 stores vectors in --dtype; sq8/sq6/sq4 (faiss scalar quantisers, bits per "
                                "value) and pq (product quantisation) are trained on the first tokens")
    transcode.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], default="float16",
                           help="storage dtype with --codec fp16")
    transcode.add_argument("--pq-subquantizers", type=int, metavar="M",
                           help="--codec pq: sub-quantisers per vector = bytes per token (must divide the width)")
    transcode.add_argument("--overwrite", action="store_true", help="replace an existing sidecar at --output")
    transcode.add_argument("--restart", action="store_true",
                           help="discard an interrupted transcode instead of resuming it")
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
        if args.command in ("assemble", "merge"):
            return _assemble(args)
        if args.command == "transcode":
            return _transcode(args)
        from .build import run_build

        result = run_build(args)
        return result if isinstance(result, int) else 0
    except (SidecarError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _info(args: argparse.Namespace) -> int:
    check_directory(args.path)
    if is_sharded(args.path):
        return _info_sharded(args)
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


def _info_sharded(args: argparse.Namespace) -> int:
    manifest = read_sharded_manifest(args.path)
    if args.json:
        print(json.dumps(manifest.to_dict(), indent=2))
    problems = []
    shard_manifests: list[Manifest | None] = []
    for entry in manifest.shards:
        try:
            shard_manifests.append(read_manifest(entry.resolve(Path(args.path))))
        except SidecarError as error:
            shard_manifests.append(None)
            problems.append(str(error))
            continue
        problems += [f"{entry.path}: {problem}" for problem in
                     size_problems(shard_manifests[-1], entry.resolve(Path(args.path)))]
    if not args.json:
        print(format_sharded_summary(manifest, args.path, shard_manifests))
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _transcode(args: argparse.Namespace) -> int:
    from .transcode import transcode_sidecar

    options = {"pq_subquantizers": args.pq_subquantizers} if args.pq_subquantizers else None
    if options and args.codec != "pq":
        raise ValueError(f"--pq-subquantizers applies to --codec pq, not {args.codec}")
    path = transcode_sidecar(args.source, args.output, codec=args.codec, dtype=args.dtype, codec_options=options,
                             overwrite=args.overwrite, restart=args.restart)
    print(f"sidecar written to {path}")
    print(format_summary(read_manifest(path), path))
    return 0


def _assemble(args: argparse.Namespace) -> int:
    from .shards import assemble_shards

    path = assemble_shards(args.output, args.shards, overwrite=args.overwrite)
    print(f"sharded sidecar written to {path / MANIFEST} ({len(args.shards)} shards)")
    return 0


def format_sharded_summary(manifest: ShardedManifest, path: str | Path,
                           shard_manifests: list[Manifest | None]) -> str:
    """A readable summary of a sharded manifest, one line per shard (its size when its manifest is readable)."""
    model = manifest.model
    docs = max(1, manifest.num_docs)
    lines = [
        f"sidecar     {path} (sharded: {len(manifest.shards)} shards, build {manifest.build_id})",
        f"format      {manifest.format} v{manifest.format_version}, created {manifest.created or '?'}",
        f"model       {model.get('model_type')} (variant {model.get('store_variant')}), "
        f"fingerprint {short_hash(manifest.model_fingerprint)}",
        f"vectors     dim {manifest.dim}, {manifest.dtype}",
        f"documents   {manifest.num_docs:,} ({manifest.num_tokens:,} tokens, "
        f"{manifest.num_tokens / docs:.1f} tokens/doc)",
        f"index       {_pairs(manifest.index)}",
        f"build       {_pairs(manifest.build) or '-'}",
    ]
    for number, (entry, shard) in enumerate(zip(manifest.shards, shard_manifests)):
        size = _human(sum(file.bytes for file in shard.files.values())) if shard is not None else "unreadable"
        lines.append(f"shard {number:<5} rows [{entry.row_start:,}, {entry.row_end:,}), {size}: {entry.path}")
    return "\n".join(lines)


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
        f"vectors     dim {manifest.dim}, {_codec_summary(manifest)}, {manifest.bytes_per_token:,} bytes/token",
        f"documents   {manifest.num_docs:,} ({manifest.num_tokens:,} tokens, "
        f"{manifest.num_tokens / docs:.1f} tokens/doc)",
        f"size        {_human(total_bytes)} ({tokens_bytes / docs:,.0f} bytes/doc of vectors)",
        f"index       {_pairs(manifest.index)}",
        f"build       {_pairs(manifest.build) or '-'}",
    ]
    if manifest.shard:
        shard = manifest.shard
        lines.append(f"shard       {shard.get('index')} of {shard.get('count')}, rows [{shard.get('row_start')}, "
                     f"{shard.get('row_end')}) of {shard.get('num_docs')}, build {shard.get('build_id')} "
                     f"(open the sidecar assembled from its shards)")
    return "\n".join(lines)


def _codec_summary(manifest: Manifest) -> str:
    """The storage dtype, or a compressed sidecar's codec with its settings and training sample."""
    if not manifest.compressed:
        return manifest.dtype
    codec = manifest.codec
    options = {key: value for key, value in (codec.get("options") or {}).items() if key != "sample_tokens"}
    settings = "".join(f", {key}={value}" for key, value in options.items())
    return f"codec {manifest.dtype}{settings} (trained on {codec.get('trained_on_tokens', 0):,} tokens)"


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
