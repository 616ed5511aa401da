"""``python -m pyserini_mores.sidecar {info,verify,build,assemble,transcode}``: inspect, check, build, assemble
and transcode sidecars.

``info``, ``verify``, ``assemble`` and ``transcode`` need neither torch nor the JVM (``transcode`` needs faiss for a
codec); ``build`` imports :mod:`.build` (torch) and the rerankers only when it is the command.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._cli import define_model_args, parse_model_args, run_parsed
from ..errors import UsageExit
from ..precision import resolve_device
from .assemble import assemble_shards
from .codecs import CODECS, codec_options
from .format import (
    MANIFEST,
    TOKENS,
    Manifest,
    SidecarError,
    check_directory,
    legacy_notice,
    read_manifest,
    short_hash,
    size_problems,
)
from .shards import ShardedManifest, codec_identity, is_sharded, read_sharded_manifest
from .transcode import transcode_sidecar
from .verify import verify_against_index, verify_sidecar


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (defining them imports nothing heavy)."""
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
    verify.add_argument("--index", help="also compare the docid of every row with this Lucene index (path or "
                                        "prebuilt name): the full check of the row-docid join, reading every "
                                        "document's docid once")
    build = commands.add_parser("build", help="encode a collection into a sidecar (`build --help` for options)")
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
                                "value), pq (product quantisation) and residual (centroid + quantised residual) "
                                "are trained on the first tokens")
    transcode.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], default="float16",
                           help="storage dtype with --codec fp16")
    define_codec_option_args(transcode)
    transcode.add_argument("--overwrite", action="store_true", help="replace an existing sidecar at --output")
    transcode.add_argument("--restart", action="store_true",
                           help="discard an interrupted transcode instead of resuming it")
    return parser


def define_build_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", required=True, help="Lucene index directory or Pyserini prebuilt index name")
    define_model_args(parser, device=True)
    parser.add_argument("--output", default=None,
                        help="sidecar directory (default: beside the index); with --shard, the shard's directory")
    parser.add_argument("--collection", default=None,
                        help="collection file (MS MARCO TSV or JSONL) for indexes that store no text")
    parser.add_argument("--batch-size", type=int, default=64, help="documents encoded per batch")
    parser.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], default="float16")
    parser.add_argument("--codec", choices=CODECS, default="fp16",
                        help="token vector codec: fp16 stores vectors in --dtype; sq8/sq6/sq4 (faiss scalar "
                             "quantisers, 8/6/4 bits per value), pq (faiss product quantisation, 1 byte per "
                             "sub-quantiser), opq (a learned rotation, then pq), rq (residual vector quantisation, "
                             "1 byte per codebook) and residual (a k-means centroid id + 1-8 bits per kept "
                             "dimension) are decoded at read time; trained on the first documents, or for a sharded "
                             "build once, on documents drawn across the collection, for every shard")
    define_codec_option_args(parser)
    parser.add_argument("--max-length", type=int, default=None, help="document length cap in tokens")
    windows = parser.add_argument_group("long documents as windows")
    windows.add_argument("--max-windows", type=int, default=1, metavar="N",
                         help="store up to N windows of a document longer than the model reads, each encoded as "
                              "a short document (default 1: the text the model reads, as without windows)")
    windows.add_argument("--window", type=int, default=None, metavar="TOKENS",
                         help="tokens per window (default: what the model reads of a document)")
    windows.add_argument("--stride", type=int, default=None, metavar="TOKENS",
                         help="tokens from one window's start to the next's (default: --window, no overlap)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing sidecar")
    parser.add_argument("--restart", action="store_true", help="discard an interrupted build instead of resuming")
    group = parser.add_argument_group("sharded and distributed builds")
    group.add_argument("--shards", type=int, default=None,
                       help="split the sidecar into this many shards of contiguous rows (shard i holds rows "
                            "i*ceil(n/N) onward); without --shard every shard is built into OUTPUT/shard-I-of-N "
                            "and assembled")
    group.add_argument("--shard", type=int, default=None,
                       help="build only this shard (0-based) of --shards at --output (default: "
                            "<sidecar dir>/shard-I-of-N); join the shards with `assemble`")
    group.add_argument("--train-codec", action="store_true",
                       help="with a compressed --codec: only train the codec every shard of the build adopts, on "
                            "documents drawn across the collection, and save it in --output (trained-codec.json "
                            "and .bin), for `--shards N --shard I` builds to adopt")
    group.add_argument("--trained-codec", default=None, metavar="DIR",
                       help="the directory of the build's trained codec (default: --output for a whole sharded "
                            "build or --train-codec, the shard directory's parent for --shard I); an unsharded build "
                            "given one adopts it instead of training its own")
    group.add_argument("--engine", choices=["local", "ray"], default="local",
                       help="local: shards one after the other in this process; ray: one Ray task per shard")
    group.add_argument("--address", default=None,
                       help="Ray cluster to connect to (auto, HOST:6379 or ray://HOST:10001); default: a Ray "
                            "instance already started in this process, else a new local one")
    group.add_argument("--max-retries", type=int, default=3, help="Ray: retries of a failed shard task")
    group.add_argument("--cpus-per-task", type=float, default=1.0, help="Ray: CPUs reserved by each shard task")
    group.add_argument("--gpus-per-task", type=float, default=None,
                       help="Ray: GPUs reserved by each shard task (default: 1 with --device cuda, else 0)")


def define_codec_option_args(parser: argparse.ArgumentParser) -> None:
    """The codecs' settings, shared by ``build`` and ``transcode``."""
    parser.add_argument("--pq-subquantizers", type=int, default=None, metavar="M",
                        help="--codec pq: sub-quantisers per vector = bytes per token (must divide the store "
                             "width; default: width / 4)")
    parser.add_argument("--nbits", type=int, default=None, metavar="B",
                        help="--codec residual: bits per kept dimension's residual, 1, 2, 4 or 8 (default 1)")
    parser.add_argument("--num-centroids", type=int, default=None, metavar="C",
                        help="--codec residual: k-means centroids, 2..65536 (default 4096; ids take 1 byte up to "
                             "256, else 2); the training sample must hold at least C tokens")
    parser.add_argument("--residual-dims", type=int, default=None, metavar="R",
                        help="--codec residual: dimensions whose residual is stored, those that vary most "
                             "(default: as many as make a code width / 8 bytes)")
    parser.add_argument("--rq-codebooks", type=int, default=None, metavar="M",
                        help="--codec rq: codebooks of 256 full-width vectors summed = bytes per token, 1..256 "
                             "(default: width / 8)")
    parser.add_argument("--rq-norms", action="store_true",
                        help="--codec rq: end each code in one byte of its vector's norm, so that a model scoring "
                             "cosines from the codes (TK) reads them without decoding: bytes per token = "
                             "--rq-codebooks + 1")
    parser.add_argument("--rq-word-stage", action="store_true",
                        help="--codec rq, build only, a model that gives token ids (tk): start each code with its "
                             "token's id (2 bytes), which decodes to that word's mean vector; the codebooks code the "
                             "rest: bytes per token = 2 + --rq-codebooks (+ 1 with --rq-norms)")
    parser.add_argument("--sample-tokens", type=int, default=None, metavar="N",
                        help="any compressed codec: how many token vectors train it (default 65,536, fewer above "
                             "width 512); more cost more training time")


def _codec_options(args: argparse.Namespace, *, check_pq: bool = True) -> dict[str, int] | None:
    """The codec settings of the command line, checked (``ValueError`` naming the flag); with ``check_pq`` false
    ``--pq-subquantizers`` is passed on as given, for the codec to check."""
    options = codec_options(args.codec, pq_subquantizers=args.pq_subquantizers if check_pq else None,
                            nbits=args.nbits, num_centroids=args.num_centroids, residual_dims=args.residual_dims,
                            rq_codebooks=args.rq_codebooks, rq_norms=args.rq_norms, sample_tokens=args.sample_tokens)
    if not check_pq and args.pq_subquantizers is not None:
        options = {**(options or {}), "pq_subquantizers": args.pq_subquantizers}
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 problems found, 2 error)."""
    return run_parsed(build_parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    if args.command == "info":
        return _info(args)
    if args.command == "verify":
        return _verify(args)
    if args.command in ("assemble", "merge"):
        return _assemble(args)
    if args.command == "transcode":
        return _transcode(args)
    return _build(args)


def _build(args: argparse.Namespace) -> int:
    """``build``: the options are checked (and Ray looked for) before the model loads; a bad option or a reranker
    without stored representations exits with its ``error:`` line."""
    try:
        from .build import BuildOptions, ModelSource, run_build
        from .ray_engine import import_ray
    except ImportError as error:
        print(f"error: the build command is unavailable: {error}", file=sys.stderr)
        return 2
    codec_settings = _codec_options(args, check_pq=False)  # a bad setting: exit 2 before the model loads
    try:
        from ..windows import WindowOptions

        windows = WindowOptions(window=args.window, stride=args.stride, max_windows=args.max_windows)
        options = BuildOptions(
            index=args.index, reranker=args.reranker or "", output=args.output, collection=args.collection,
            batch_size=args.batch_size, dtype=args.dtype, codec=args.codec, codec_options=codec_settings,
            trained_codec=args.trained_codec, train_codec=args.train_codec, precision=args.precision,
            device=args.device, overwrite=args.overwrite, restart=args.restart,
            shards=args.shards, shard=args.shard, engine=args.engine, address=args.address,
            max_retries=args.max_retries, cpus_per_task=args.cpus_per_task, gpus_per_task=args.gpus_per_task,
            windows=windows, rq_word_stage=args.rq_word_stage)
        if options.engine == "ray":
            import_ray()  # before loading any model: say at once what to install
        resolve_device(options.device)  # likewise: a GPU that is not there fails before the model loads
    except (ValueError, ImportError) as error:
        raise UsageExit(f"{error}") from None
    name, model = _stored_model(args)
    path = run_build(dataclasses.replace(options, reranker=name, model=ModelSource.of(model)), model)
    if options.train_codec:
        from .trained_codec import load_trained_codec

        trained = load_trained_codec(path)
        print(f"trained codec written to {path}: {trained.describe()}, trained on {trained.trained_on:,} tokens of "
              f"{trained.sample.get('documents', 0):,} documents drawn across the collection")
        return 0
    print(f"sidecar written to {path}")
    print(build_summary(path))
    return 0


def build_summary(path: str | Path) -> str:
    """One line on what a build stored: documents, windows, what --max-windows left out, bytes."""
    manifest = read_sharded_manifest(path) if is_sharded(path) else read_manifest(path)
    build = manifest.build
    if is_sharded(path):
        size = sum(read_manifest(entry.resolve(Path(path))).files[TOKENS].bytes for entry in manifest.shards)
    else:
        size = manifest.files[TOKENS].bytes
    stored = build.get("windows_stored", manifest.num_docs)
    return (f"stored {manifest.num_docs:,} documents as {stored:,} windows ({manifest.num_tokens:,} tokens, "
            f"{_human(size)} of vectors); {build.get('capped_documents', 0):,} documents capped by --max-windows "
            f"({build.get('windows_dropped', 0):,} windows not stored), {build.get('truncated_documents', 0):,} "
            f"documents truncated")


def _stored_model(args: argparse.Namespace):
    """The reranker's name and its model, which must store document representations."""
    from ..rerankers import LEARNED_RERANKERS, get_reranker
    from ..rerankers.options import check_config

    if not args.reranker:
        raise UsageExit("--reranker is required")
    overrides = parse_model_args(args.model_arg)
    if args.max_length:
        overrides["doc_max_length"] = args.max_length
    if args.reranker in LEARNED_RERANKERS:  # refused before the model loads, naming the keys the model knows
        check_config(args.reranker, overrides, given_as="--model-arg")
    learned = args.reranker in LEARNED_RERANKERS or args.model or overrides
    # The built-in learned rerankers place their model on the device; run_build moves a plugin's there.
    placed = {"device": args.device} if args.reranker in LEARNED_RERANKERS else {}
    reranker = (get_reranker(args.reranker, model=args.model, **placed, **overrides) if learned
                else get_reranker(args.reranker))
    model = getattr(reranker, "model", None)
    if model is None or model.store_width is None:
        raise UsageExit(f"reranker '{args.reranker}' stores no document representations; "
                         "it needs no sidecar")
    return reranker.name, model


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
    try:  # a manifest that cannot be read is one line: nothing else can be checked
        check_directory(args.path)
        read_sharded_manifest(args.path) if is_sharded(args.path) else read_manifest(args.path)
    except SidecarError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    problems = verify_sidecar(args.path)
    if args.index is not None and not problems:
        problems = verify_against_index(args.path, args.index)
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
    options = _codec_options(args)
    if args.rq_word_stage:
        raise ValueError("--rq-word-stage codes each token's id, which a sidecar does not keep: build the store with "
                        "`sidecar build --codec rq --rq-word-stage` instead of transcoding")
    path = transcode_sidecar(args.source, args.output, codec=args.codec, dtype=args.dtype, codec_options=options,
                             overwrite=args.overwrite, restart=args.restart)
    print(f"sidecar written to {path}")
    print(format_summary(read_manifest(path), path))
    return 0


def _assemble(args: argparse.Namespace) -> int:
    path = assemble_shards(args.output, args.shards, overwrite=args.overwrite)
    print(f"sharded sidecar written to {path / MANIFEST} ({len(args.shards)} shards)")
    return 0


def format_sharded_summary(manifest: ShardedManifest, path: str | Path,
                           shard_manifests: list[Manifest | None]) -> str:
    """A readable summary of a sharded manifest, one line per shard (its size when its manifest is readable)."""
    model = manifest.model
    docs = max(1, manifest.num_docs)
    first = next((shard for shard in shard_manifests if shard is not None), None)
    lines = [
        f"sidecar     {path} (sharded: {len(manifest.shards)} shards, build {manifest.build_id})",
        f"format      {manifest.format} v{manifest.format_version}, created {manifest.created or '?'}",
        f"model       {model.get('model_type')} (variant {model.get('store_variant')}), "
        f"fingerprint {short_hash(manifest.model_fingerprint)}",
        f"vectors     dim {manifest.dim}, {_sharded_codec_summary(manifest, shard_manifests, first)}",
        f"documents   {manifest.num_docs:,} ({manifest.num_tokens:,} tokens, "
        f"{manifest.num_tokens / docs:.1f} tokens/doc)",
        f"index       {_pairs(manifest.index)}",
        f"encoded     {_encoding(manifest.build)}",
        f"build       {_pairs(manifest.build) or '-'}",
    ]
    if first is not None:
        lines.append(f"windows     per shard: {_windows_summary(first, path)} (shard {shard_manifests.index(first)})")
    legacy = [shard for shard in shard_manifests if shard is not None and shard.lacks_integrity]
    if legacy:
        version = min(shard.format_version for shard in legacy)
        subject = f"{len(legacy)} of {len(manifest.shards)} shards are format {version}: they have"
        lines.append(f"integrity   {legacy_notice(path, version, subject)}")
    for number, (entry, shard) in enumerate(zip(manifest.shards, shard_manifests)):
        size = _human(sum(file.bytes for file in shard.files.values())) if shard is not None else "unreadable"
        version = f", format {shard.format_version}" if shard is not None and shard.lacks else ""
        lines.append(f"shard {number:<5} rows [{entry.row_start:,}, {entry.row_end:,}), {size}{version}: "
                     f"{entry.path}")
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
        f"integrity   {_integrity(manifest, path)}",
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
        f"windows     {_windows_summary(manifest, path)}",
        f"index       {_pairs(manifest.index)}",
        f"encoded     {_encoding(manifest.build)}",
        f"build       {_pairs(manifest.build) or '-'}",
    ]
    if manifest.shard:
        shard = manifest.shard
        lines.append(f"shard       {shard.get('index')} of {shard.get('count')}, rows [{shard.get('row_start')}, "
                     f"{shard.get('row_end')}) of {shard.get('num_docs')}, build {shard.get('build_id')} "
                     f"(open the sidecar assembled from its shards)")
    return "\n".join(lines)


def _windows_summary(manifest: Manifest, path: str | Path) -> str:
    """How the sidecar's documents were cut into windows, or what its older format lacks."""
    if not manifest.has_windows:
        return f"none (format {manifest.format_version}: one window per document, the text the model reads)"
    windows = manifest.windows
    return (f"{windows['num_windows']:,} of up to {windows['max_windows']} per document, {windows['window']} tokens "
            f"every {windows['stride']} (the model reads {windows['capacity']}), "
            f"{windows['capped_documents']:,} documents capped by --max-windows")


def _integrity(manifest: Manifest, path: str | Path) -> str:
    """What the sidecar's reads are checked against, or what its older format lacks."""
    if manifest.lacks_integrity:
        return legacy_notice(path, manifest.format_version, f"this sidecar is format {manifest.format_version}: it has")
    texts = "document text hashes" if manifest.index.get("content") else "no document text hashes (index without text)"
    return f"block checksums checked on first read, manifest checksum, {texts}"


def _encoding(build: dict[str, Any]) -> str:
    """The compute precision and device the vectors were encoded under (``unknown`` for builds that did not record
    them): what the sidecar's scores match a from-text run of."""
    precision = build.get("precision") or "unknown"
    device = build.get("device") or "unknown"
    note = (" (an fp32 reranker matches its from-text scores only to bf16 accuracy)" if precision == "bf16"
            else " (not recorded by the build)" if "unknown" in (precision, device) else "")
    return f"precision {precision}, device {device}{note}"


def _sharded_codec_summary(manifest: ShardedManifest, shard_manifests: list[Manifest | None],
                           first: Manifest | None) -> str:
    """The shards' storage dtype, or their codec as a shard's summary gives it (the top-level manifest records the
    dtype only), and whether every readable shard has that one codec (the same trained parameters)."""
    if first is None or not first.compressed:
        return manifest.dtype
    codecs = {json.dumps(codec_identity(shard), sort_keys=True) for shard in shard_manifests if shard is not None}
    shared = "one codec in every shard" if len(codecs) == 1 else f"{len(codecs)} different codecs across the shards"
    return f"{_codec_summary(first)}, {first.bytes_per_token:,} bytes/token, {shared}"


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
