"""The sidecar's on-disk format: file names, dtypes, the manifest schema, block checksums and open-time validation.

Needs only the standard library and numpy, so reading a manifest (``sidecar info``) never starts torch.

A sidecar is a directory::

    manifest.json             written last; everything below is described (bytes, sha256, dtype, shape) in it
    tokens.bin                [num_tokens, dim]  token vectors of every document, only real tokens, row order
    offsets.bin               [num_docs + 1]     int64 prefix sums: document row i is tokens[offsets[i]:offsets[i+1]]
    docids.bin                [num_docs]         S{w} docids in row order (row i = Lucene internal docid i)
    docids_sorted.bin         [num_docs]         the same docids sorted (np.searchsorted on the memmap)
    docids_sorted_rows.bin    [num_docs]         int64 row of each sorted docid
    codec.bin                 [parameters]       float32 trained codec parameters (compressed sidecars only)
    content_hashes.bin        [num_docs]         uint64 hash of each row's document text (when the index stores text)
    windows.bin               [num_docs + 1]     int64 prefix sums of windows: row i's are windows[i] .. windows[i+1]-1
    window_offsets.bin        [num_windows + 1]  int64 token offsets: window k is tokens[wo[k]:wo[k+1]]
    checksums.bin             [blocks]           uint64 xxh3_64 (uint32 crc32 before) of every READ_BLOCK_BYTES block of
                                                 the files above

A compressed sidecar (:mod:`.codecs`) has a codec name as its ``dtype`` and a ``codec`` manifest field; its
``tokens.bin`` holds uint8 codes ``[num_tokens, codec.code_size]``.

All files are flat little-endian arrays without headers. Whole-file checksums (``verify``) are "sha256-blocks": the
sha256 of the concatenated raw sha256 digests of consecutive ``block_bytes``-sized blocks of the file (an empty file
has no blocks); unlike a plain sha256 it can be carried across an interrupted build by re-reading at most one block.
``checksums.bin`` holds the hash named by the manifest's ``checksum.read_algorithm`` (:data:`READ_CHECKSUM_DTYPES`:
``xxh3_64`` as written now, ``crc32`` in sidecars written before) of every ``read_block_bytes`` block of each data
file, in :attr:`Manifest.block_files` order, over the raw bytes (whatever the codec): a reader checks a block the
first time it reads from it. The
manifest's own ``manifest_sha256`` covers every other field, so an edited dtype, width or count is refused.

A document longer than the model reads is stored as overlapping windows (:mod:`pyserini_mores.windows`), each
encoded as a short document; a row's tokens are its windows' tokens one after the other, so
``offsets[i] == window_offsets[windows[i]]``. The manifest's ``windows`` field records how they were cut. A build
without windows stores one window per row.

Format 2 had no window map: it opens with one window per row. Format 1 had neither ``checksums.bin`` nor
``content_hashes.bin`` nor ``manifest_sha256``, and its index identity covers docids only; both still open
(:data:`LEGACY_FORMATS`), their values range-checked like format 3's, and readers say what they lack
(:func:`legacy_notice`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import UserFixableError

FORMAT_NAME = "pyserini-mores-sidecar"
FORMAT_VERSION = 3
# Older formats this package still opens, each with what it lacks against FORMAT_VERSION.
LEGACY_FORMATS: dict[int, str] = {
    1: "block checksums, manifest checksum, document text hashes or windows",
    2: "windows",
}

MANIFEST = "manifest.json"
TOKENS = "tokens.bin"
OFFSETS = "offsets.bin"
DOCIDS = "docids.bin"
DOCIDS_SORTED = "docids_sorted.bin"
DOCIDS_SORTED_ROWS = "docids_sorted_rows.bin"
CODEC = "codec.bin"
CONTENT = "content_hashes.bin"
BLOCK_CHECKSUMS = "checksums.bin"
WINDOWS = "windows.bin"
WINDOW_OFFSETS = "window_offsets.bin"
DATA_FILES = (TOKENS, OFFSETS, DOCIDS, DOCIDS_SORTED, DOCIDS_SORTED_ROWS, BLOCK_CHECKSUMS)
# The window map, format 3 on (covered by checksums.bin after the files above).
WINDOW_FILES = (WINDOWS, WINDOW_OFFSETS)
# Format 3's ``windows`` manifest field.
WINDOW_FIELDS = ("window", "stride", "max_windows", "capacity", "num_windows", "capped_documents")

PARTIAL_SUFFIX = ".partial"
CHECKSUM_ALGORITHM = "sha256-blocks"
DEFAULT_BLOCK_BYTES = 64 * 1024 * 1024
# Blocks checked on first read: small enough that a candidate's few rows cost little more than their own bytes.
READ_BLOCK_BYTES = 16 * 1024
# Hashes of those blocks, by ``checksum.read_algorithm``, and the dtype of their entries in checksums.bin. Sidecars
# are written with xxh3_64 (faster than crc32 per byte, which a block's first read pays); crc32, what
# sidecars were written with before, is still read.
READ_CHECKSUM_DTYPES: dict[str, np.dtype] = {"xxh3_64": np.dtype("<u8"), "crc32": np.dtype("<u4")}
READ_CHECKSUM_ALGORITHM = "xxh3_64"
# A manifest of format 2 or later without the field was written before there was a choice.
LEGACY_READ_CHECKSUM_ALGORITHM = "crc32"
CONTENT_DTYPE = np.dtype("<u8")

# Ranges a manifest value must lie in before it sizes an array or a read (far above any real sidecar).
MAX_DIM = 1 << 16
MAX_DOCS = 1 << 40
MAX_TOKENS = 1 << 48
MAX_DOCID_WIDTH = 4096
MAX_FILE_BYTES = 1 << 56

# Storage dtype of tokens.bin per manifest dtype. bfloat16 has no numpy dtype: its raw bits are stored as uint16.
STORAGE_DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "bfloat16": np.dtype("<u2"),
}
INDEX_DTYPE = np.dtype("<i8")
# Compressed codecs (:mod:`.codecs`) by manifest dtype: tokens.bin then holds uint8 codes, codec.bin float32 parameters.
CODEC_DTYPES = ("sq8", "sq6", "sq4", "pq", "opq", "residual", "rq")
CODE_DTYPE = np.dtype("u1")
CODEC_PARAMETER_DTYPE = np.dtype("<f4")


class SidecarError(UserFixableError):
    """Base class of every sidecar problem."""


class SidecarNotFoundError(SidecarError, FileNotFoundError):
    """The sidecar directory does not exist, or only an unfinished ``.partial`` build does."""


class SidecarMismatchError(SidecarError, ValueError):
    """An intact sidecar of another model, index, dtype or dim (or a resumed build with other parameters)."""


class SidecarRowMismatchError(SidecarMismatchError):
    """A candidate's row in the sidecar holds another document: the candidate comes from another index than the
    sidecar's (or carries a wrong ``lucene_docid``), and would be scored with another document's vectors.

    Attributes: ``docid`` (the candidate's), ``row`` (its ``lucene_docid``), ``stored_docid`` (the sidecar's at
    that row), ``mismatches`` (how many candidates of the batch disagree).
    """

    def __init__(self, message: str, *, docid: str, row: int, stored_docid: str, mismatches: int = 1):
        super().__init__(message)
        self.docid, self.row, self.stored_docid, self.mismatches = docid, row, stored_docid, mismatches


class SidecarContentMismatchError(SidecarMismatchError):
    """The index holds the sidecar's documents in the same rows, but some of their texts changed since the build:
    the stored vectors are stale. Attributes: ``changed`` (how many documents, or None when not counted),
    ``examples`` (the first few of their docids), ``summary`` (the message without the rebuild advice)."""

    def __init__(self, summary: str, advice: str, *, changed: int | None = None, examples: Sequence[str] = ()):
        super().__init__(f"{summary}; {advice}")
        self.summary, self.changed, self.examples = summary, changed, list(examples)


class SidecarCorruptError(SidecarError):
    """The sidecar's files disagree with its manifest (truncated, missing, unreadable manifest)."""


def checked_codec_parameters(parameters: np.ndarray, expected: int, codec: str, described: str) -> np.ndarray:
    """``parameters`` (a trained codec's ``codec.bin``) as flat float32, or :class:`SidecarCorruptError` when they are
    not ``expected`` values (``described``, e.g. ``the opq codec (dim 16, M 4)``, names the codec and its settings)
    or not all finite (``codec``: its name)."""
    parameters = np.ascontiguousarray(parameters, dtype=np.float32).reshape(-1)
    if parameters.size != expected:
        raise SidecarCorruptError(f"{described} has {expected} parameters, not {parameters.size}")
    if not np.isfinite(parameters).all():
        raise SidecarCorruptError(f"the {codec} codec's parameters are not all finite")
    return parameters


class SidecarExistsError(SidecarError, FileExistsError):
    """A writer would replace an existing complete sidecar (pass ``overwrite=True``) or a directory that is none."""


def short_hash(value: str, length: int = 12) -> str:
    """The first ``length`` characters of a hex fingerprint, for messages."""
    return str(value)[:length]


def json_normalized(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), so caller dicts compare equal to manifest dicts."""
    return json.loads(json.dumps(value))


def docid_dtype(width: int) -> np.dtype:
    return np.dtype(f"S{max(1, int(width))}")


# ---- the manifest ------------------------------------------------------------------------------------------------
@dataclass
class FileEntry:
    """One data file: its size in bytes, block checksum, numpy dtype string and array shape."""

    bytes: int
    sha256: str
    dtype: str
    shape: list[int]


@dataclass
class Manifest:
    """The content of ``manifest.json``. ``model``, ``index`` and ``build`` are free-form dicts (see the writer)."""

    dim: int
    dtype: str
    num_docs: int
    num_tokens: int
    docid_width: int
    files: dict[str, FileEntry]
    model: dict[str, Any]
    index: dict[str, Any]
    build: dict[str, Any] = field(default_factory=dict)
    # Set only on a shard of a sharded sidecar (see :mod:`.shards`): its global row range and the parent build id.
    shard: dict[str, Any] = field(default_factory=dict)
    # Set only on a compressed sidecar (dtype = a codec name): see :mod:`.codecs`.
    codec: dict[str, Any] = field(default_factory=dict)
    # How documents were cut into windows (format 3 on): WINDOW_FIELDS.
    windows: dict[str, Any] = field(default_factory=dict)
    checksum: dict[str, Any] = field(
        default_factory=lambda: {"algorithm": CHECKSUM_ALGORITHM, "block_bytes": DEFAULT_BLOCK_BYTES})
    created: str = ""
    library: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    # sha256 of every other field (canonical JSON): see :func:`manifest_digest`.
    manifest_sha256: str = ""

    @property
    def model_fingerprint(self) -> str:
        return str(self.model.get("fingerprint", ""))

    @property
    def build_precision(self) -> str | None:
        """The compute precision the vectors were encoded under (``fp32``, ``bf16``), or ``None`` when the build did
        not record it."""
        precision = self.build.get("precision")
        return str(precision) if precision else None

    @property
    def build_device(self) -> str | None:
        """The device the vectors were encoded on (``cpu``, ...), or ``None`` when the build did not record it."""
        device = self.build.get("device")
        return str(device) if device else None

    @property
    def storage_dtype(self) -> np.dtype:
        return CODE_DTYPE if self.compressed else STORAGE_DTYPES[self.dtype]

    @property
    def compressed(self) -> bool:
        """Whether ``tokens.bin`` holds codec codes rather than vectors."""
        return self.dtype in CODEC_DTYPES

    @property
    def bytes_per_token(self) -> int:
        """Stored bytes of one token vector (its code size when compressed)."""
        width = int(self.codec["code_size"]) if self.compressed else self.dim
        return width * self.storage_dtype.itemsize

    @property
    def data_files(self) -> tuple[str, ...]:
        """Every file the manifest describes (and checksums)."""
        return (*self.block_files, BLOCK_CHECKSUMS) if self.has_block_checksums else self.block_files

    @property
    def block_files(self) -> tuple[str, ...]:
        """The files ``checksums.bin`` covers, in its order."""
        return (tuple(name for name in DATA_FILES if name != BLOCK_CHECKSUMS) + ((CODEC,) if self.compressed else ())
                + ((CONTENT,) if self.index.get("content") else ()) + (WINDOW_FILES if self.has_windows else ()))

    @property
    def has_windows(self) -> bool:
        """Whether the sidecar has a window map (format 3 on; older ones have one window per row)."""
        return self.format_version >= 3

    @property
    def num_windows(self) -> int:
        """Windows stored (``num_docs`` for a sidecar without a window map)."""
        return int(self.windows["num_windows"]) if self.has_windows else self.num_docs

    @property
    def has_block_checksums(self) -> bool:
        """Whether the sidecar has ``checksums.bin`` (format 2 on; format 1 has whole-file checksums only)."""
        return self.format_version >= 2

    @property
    def lacks(self) -> str | None:
        """What an older format lacks against :data:`FORMAT_VERSION` (None for the current format)."""
        return LEGACY_FORMATS.get(self.format_version)

    @property
    def lacks_integrity(self) -> bool:
        """Whether reads go unchecked (format 1: no block checksums, no text hashes): readers warn at open. A
        format-2 sidecar lacks only the window map, which matters only to a windowed aggregation."""
        return self.format_version < 2

    @property
    def block_bytes(self) -> int:
        return int(self.checksum.get("block_bytes", DEFAULT_BLOCK_BYTES))

    @property
    def read_block_bytes(self) -> int:
        return int(self.checksum.get("read_block_bytes", READ_BLOCK_BYTES))

    @property
    def read_algorithm(self) -> str:
        """The hash of ``checksums.bin`` (a key of :data:`READ_CHECKSUM_DTYPES`)."""
        return str(self.checksum.get("read_algorithm", LEGACY_READ_CHECKSUM_ALGORITHM))

    def block_ranges(self) -> dict[str, tuple[int, int]]:
        """Each covered file's ``[first, end)`` entries in ``checksums.bin``."""
        ranges, start = {}, 0
        for name, size in self.expected_bytes().items():
            if name == BLOCK_CHECKSUMS:
                continue
            count = -(-size // self.read_block_bytes)
            ranges[name] = (start, start + count)
            start += count
        return ranges

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # Readers look at the format first: put it on top of the file.
        head = {"format": data.pop("format"), "format_version": data.pop("format_version")}
        if not data["shard"]:
            del data["shard"]  # unsharded manifests stay exactly as before shards existed
        if not data["codec"]:
            del data["codec"]  # so do uncompressed ones
        if not data["manifest_sha256"]:
            del data["manifest_sha256"]  # and format 1 ones, which have no manifest checksum
        if not data["windows"]:
            del data["windows"]  # and format 1 and 2 ones, which have no window map
        return {**head, **data}

    def sealed(self) -> dict[str, Any]:
        """:meth:`to_dict` with ``manifest_sha256`` set over everything else: what the writer stores."""
        data = self.to_dict()
        data["manifest_sha256"] = manifest_digest(data)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = MANIFEST) -> Manifest:
        """Parse a manifest dict; a missing or ill-typed field raises :class:`SidecarCorruptError` naming it."""
        if data.get("format", FORMAT_NAME) != FORMAT_NAME:
            raise SidecarCorruptError(f"{source}: format is {data.get('format')!r}, not {FORMAT_NAME!r}")
        version = data.get("format_version")
        if not isinstance(version, int):
            raise SidecarCorruptError(f"{source}: field 'format_version' is missing or not an integer")
        if version > FORMAT_VERSION:
            raise SidecarMismatchError(
                f"{source}: sidecar format_version is {version}, this pyserini_mores reads version "
                f"{FORMAT_VERSION}; upgrade pyserini_mores to read it")
        if version != FORMAT_VERSION and version not in LEGACY_FORMATS:
            raise SidecarCorruptError(f"{source}: field 'format_version' is {version}, not a sidecar format "
                                      f"version ({', '.join(map(str, sorted(LEGACY_FORMATS)))} or {FORMAT_VERSION})")
        legacy = version != FORMAT_VERSION
        unsealed = version < 2  # format 1: no checksums.bin, no manifest checksum
        required = {"dim": int, "dtype": str, "num_docs": int, "num_tokens": int, "docid_width": int,
                    "files": dict, "model": dict, "index": dict}
        for name, kind in required.items():
            if not isinstance(data.get(name), kind) or isinstance(data.get(name), bool):
                raise SidecarCorruptError(f"{source}: field '{name}' is missing or not {_KIND_NAMES[kind]}")
        for name in ("shard", "codec", "checksum", "build", "library", "windows"):
            if not isinstance(data.get(name, {}), dict):
                raise SidecarCorruptError(f"{source}: field '{name}' is not a JSON object")
        if legacy:
            _check_legacy_fields(data, version, source)
        _check_ranges(data, source)
        if version >= 3:
            _check_windows(data, source)
        if data["dtype"] not in STORAGE_DTYPES and data["dtype"] not in CODEC_DTYPES:
            raise SidecarCorruptError(f"{source}: field 'dtype' is {data['dtype']!r}, expected one of "
                                      f"{sorted(STORAGE_DTYPES) + list(CODEC_DTYPES)}")
        compressed = data["dtype"] in CODEC_DTYPES
        codec = data.get("codec", {})
        if compressed and not (isinstance(codec, dict) and codec.get("name") == data["dtype"]
                               and _positive_int(codec.get("code_size"))
                               and _positive_int(codec.get("parameter_count"))):
            raise SidecarCorruptError(f"{source}: field 'codec' is missing or incomplete for dtype "
                                      f"{data['dtype']!r} (needs name, code_size and parameter_count)")
        files = {}
        names = (tuple(name for name in DATA_FILES if not (unsealed and name == BLOCK_CHECKSUMS))
                 + ((CODEC,) if compressed else ()) + ((CONTENT,) if data["index"].get("content") else ())
                 + (WINDOW_FILES if version >= 3 else ()))
        for name in names:
            entry = data["files"].get(name)
            if not (isinstance(entry, dict) and _int_in(entry.get("bytes"), 0, MAX_FILE_BYTES)
                    and isinstance(entry.get("sha256"), str) and isinstance(entry.get("dtype"), str)
                    and isinstance(entry.get("shape"), list)
                    and all(_int_in(n, 0, MAX_FILE_BYTES) for n in entry["shape"])):
                raise SidecarCorruptError(f"{source}: field 'files.{name}' is missing or incomplete, or out of range")
            files[name] = FileEntry(bytes=entry["bytes"], sha256=entry["sha256"], dtype=entry["dtype"],
                                    shape=list(entry["shape"]))
        known = {f for f in cls.__dataclass_fields__} - {"files"}
        manifest = cls(files=files, **{k: v for k, v in data.items() if k in known})
        total = sum(manifest.expected_bytes().values())
        if total > MAX_FILE_BYTES:
            raise SidecarCorruptError(f"{source}: its counts and widths imply {total} bytes of data, beyond any "
                                      f"sidecar (num_docs, num_tokens, dim or docid_width is wrong)")
        # Last: a field edited to an impossible value is named above; a plausible edit is caught here.
        recorded = data.get("manifest_sha256")
        if not unsealed and recorded != manifest_digest(data):
            raise SidecarCorruptError(
                f"{source}: the manifest's checksum (manifest_sha256) does not match its content: it was edited or "
                f"damaged after the build, and its dtype, widths or counts cannot be trusted; rebuild the sidecar "
                f"(`python -m pyserini_mores.sidecar build ... --overwrite`)")
        return manifest

    def expected_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Each data file's dtype and shape as implied by ``dim``, ``num_docs``, ``num_tokens``, ``docid_width``."""
        docids = docid_dtype(self.docid_width)
        layout = {
            TOKENS: (self.storage_dtype, (self.num_tokens, self.dim)),
            OFFSETS: (INDEX_DTYPE, (self.num_docs + 1,)),
            DOCIDS: (docids, (self.num_docs,)),
            DOCIDS_SORTED: (docids, (self.num_docs,)),
            DOCIDS_SORTED_ROWS: (INDEX_DTYPE, (self.num_docs,)),
        }
        if self.compressed:
            layout[TOKENS] = (CODE_DTYPE, (self.num_tokens, int(self.codec["code_size"])))
            layout[CODEC] = (CODEC_PARAMETER_DTYPE, (int(self.codec["parameter_count"]),))
        if self.index.get("content"):
            layout[CONTENT] = (CONTENT_DTYPE, (self.num_docs,))
        if self.has_windows:
            layout[WINDOWS] = (INDEX_DTYPE, (self.num_docs + 1,))
            layout[WINDOW_OFFSETS] = (INDEX_DTYPE, (self.num_windows + 1,))
        if self.has_block_checksums:
            blocks = sum(-(-math.prod(shape) * dtype.itemsize // self.read_block_bytes)
                         for dtype, shape in layout.values())
            layout[BLOCK_CHECKSUMS] = (READ_CHECKSUM_DTYPES[self.read_algorithm], (blocks,))
        return layout

    def expected_bytes(self) -> dict[str, int]:
        # Python integers: absurd counts must not wrap around in int64 before they are refused.
        return {name: math.prod(shape) * dtype.itemsize for name, (dtype, shape) in self.expected_layout().items()}


_KIND_NAMES = {int: "an integer", str: "a string", dict: "a JSON object"}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_legacy_fields(data: Mapping[str, Any], version: int, source: str) -> None:
    """Refuse an older-format manifest that carries what only a later format writes: a newer manifest whose
    version was edited down, which would otherwise skip the checks that the newer fields enable."""
    later = ("manifest_sha256", "windows") if version < 2 else ("windows",)
    newer = ([name for name in later if name in data]
             + [f"index.{name}" for name in ("content",) if name in data["index"] and version < 2]
             + [f"files.{name}" for name in (BLOCK_CHECKSUMS, CONTENT) if name in data["files"] and version < 2]
             + [f"files.{name}" for name in WINDOW_FILES if name in data["files"]]
             + [f"checksum.{name}" for name in ("read_algorithm", "read_block_bytes")
                if name in data.get("checksum", {}) and version < 2])
    if newer:
        raise SidecarCorruptError(
            f"{source}: format_version is {version} but the manifest holds {', '.join(newer)}, which format "
            f"{version} does not have: its version was edited; rebuild the sidecar "
            f"(`python -m pyserini_mores.sidecar build ... --overwrite`)")


def legacy_notice(path: str | os.PathLike, version: int, subject: str | None = None) -> str:
    """One line on what a sidecar of older format ``version`` at ``path`` lacks and what to run about it
    (``subject``: how the line starts, up to "has" or "have"; default ``sidecar PATH is format 1: it has``)."""
    subject = subject or f"sidecar {path} is format {version}: it has"
    rebuild = f"`python -m pyserini_mores.sidecar build ... --output {path} --max-windows N --overwrite`"
    if version >= 2:
        return (f"{subject} no {LEGACY_FORMATS[version]}, so windowed aggregations (maxp, sump, avgcls) read one "
                f"window per document, the text the model reads before it truncates; {rebuild} rebuilds it in "
                f"format {FORMAT_VERSION} with windows")
    return (f"{subject} no {LEGACY_FORMATS[version]}, so damaged bytes and changed document texts are not detected "
            f"at search time and windowed aggregations read one window per document; `python -m "
            f"pyserini_mores.sidecar verify {path} --index INDEX` checks its files whole, {rebuild} rebuilds it in "
            f"format {FORMAT_VERSION}")


def _check_ranges(data: Mapping[str, Any], source: str) -> None:
    """Refuse a manifest value that would size an array or a read absurdly, naming the field and its range."""
    bounds = {"dim": (1, MAX_DIM), "num_docs": (0, MAX_DOCS), "num_tokens": (0, MAX_TOKENS),
              "docid_width": (1, MAX_DOCID_WIDTH)}
    for name, (low, high) in bounds.items():
        if not _int_in(data[name], low, high):
            raise SidecarCorruptError(f"{source}: field '{name}' is {data[name]!r}, outside [{low}, {high}]")
    checksum = data.get("checksum", {})
    for name, default, (low, high) in (("block_bytes", DEFAULT_BLOCK_BYTES, (1, 1 << 40)),
                                       ("read_block_bytes", READ_BLOCK_BYTES, (512, 1 << 30))):
        value = checksum.get(name, default)
        if not _int_in(value, low, high):
            raise SidecarCorruptError(f"{source}: field 'checksum.{name}' is {value!r}, not an integer in "
                                      f"[{low}, {high}]")
    algorithm = checksum.get("read_algorithm", LEGACY_READ_CHECKSUM_ALGORITHM)
    if not isinstance(algorithm, str) or algorithm not in READ_CHECKSUM_DTYPES:
        raise SidecarCorruptError(f"{source}: field 'checksum.read_algorithm' is {algorithm!r}, not one of "
                                  f"{', '.join(map(repr, READ_CHECKSUM_DTYPES))}")
    codec = data.get("codec", {})
    for name, high in (("code_size", MAX_DIM * 4), ("parameter_count", 1 << 32)):
        if name in codec and not _int_in(codec[name], 1, high):
            raise SidecarCorruptError(f"{source}: field 'codec.{name}' is {codec[name]!r}, outside [1, {high}]")
    index = data["index"]
    if "num_docs" in index and not _int_in(index["num_docs"], 0, MAX_DOCS):
        raise SidecarCorruptError(f"{source}: field 'index.num_docs' is {index['num_docs']!r}, outside "
                                  f"[0, {MAX_DOCS}]")
    for name in ("signature", "content"):
        if name in index and not isinstance(index[name], str):
            raise SidecarCorruptError(f"{source}: field 'index.{name}' is not a string")
    shard = data.get("shard", {})
    for name in ("index", "count", "row_start", "row_end", "num_docs"):
        if name in shard and not _int_in(shard[name], 0, MAX_DOCS):
            raise SidecarCorruptError(f"{source}: field 'shard.{name}' is {shard[name]!r}, outside [0, {MAX_DOCS}]")


def _check_windows(data: Mapping[str, Any], source: str) -> None:
    """Refuse a format-3 ``windows`` field that is missing a value or holds one outside its range."""
    windows = data.get("windows")
    if not isinstance(windows, dict) or not windows:
        raise SidecarCorruptError(f"{source}: field 'windows' is missing (format 3 records how documents were cut)")
    num_docs = data["num_docs"]
    bounds = {"window": (1, MAX_TOKENS), "stride": (1, MAX_TOKENS), "max_windows": (1, MAX_TOKENS),
              "capacity": (1, MAX_TOKENS), "num_windows": (num_docs, MAX_DOCS), "capped_documents": (0, num_docs)}
    for name, (low, high) in bounds.items():
        # A store written without a build's window settings records window, stride and capacity as null.
        unrecorded = name in ("window", "stride", "capacity") and name in windows and windows[name] is None
        if not (unrecorded or _int_in(windows.get(name), low, high)):
            raise SidecarCorruptError(f"{source}: field 'windows.{name}' is {windows.get(name)!r}, outside "
                                      f"[{low}, {high}]")
    sizes = [windows["window"], windows["stride"], windows["capacity"]]
    if None not in sizes and (sizes[0] > sizes[2] or sizes[1] > sizes[0]):
        raise SidecarCorruptError(f"{source}: field 'windows' has window {windows['window']}, stride "
                                  f"{windows['stride']} and capacity {windows['capacity']}: a window is at most "
                                  "the capacity long and a stride at most a window")
    if windows["num_windows"] > num_docs * windows["max_windows"]:
        raise SidecarCorruptError(f"{source}: field 'windows.num_windows' is {windows['num_windows']}, more than "
                                  f"max_windows {windows['max_windows']} per document of {num_docs}")


def manifest_digest(data: Mapping[str, Any]) -> str:
    """sha256 of a manifest dict's canonical JSON without its ``manifest_sha256`` (sorted keys, no spaces)."""
    body = {key: value for key, value in data.items() if key != "manifest_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read ``<path>/manifest.json`` (``path`` is the sidecar directory). Pure JSON: no torch, no memmaps."""
    file, data = read_manifest_object(path)
    return Manifest.from_dict(data, source=str(file))


def read_manifest_object(path: str | os.PathLike) -> tuple[Path, dict]:
    """``<path>/manifest.json`` and the JSON object it holds (of a sidecar or a sharded one), or a
    :class:`SidecarCorruptError` that says what is wrong with it."""
    file = Path(path) / MANIFEST
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SidecarCorruptError(f"{file} is missing: {path} is not a complete sidecar") from None
    except (OSError, ValueError) as error:
        raise SidecarCorruptError(f"{file} is unreadable: {error}") from None
    if not isinstance(data, dict):
        raise SidecarCorruptError(f"{file} does not hold a JSON object")
    return file, data


# ---- where sidecars live -----------------------------------------------------------------------------------------
def default_sidecar_path(index_path: str | os.PathLike, reranker_name: str, model) -> Path:
    """``<index_dir>.sidecars/<reranker>-<variant>-<fingerprint[:12]>``: beside the index (for a prebuilt index,
    beside it in Pyserini's cache), one directory per reranker, stored variant and model."""
    index_path = Path(index_path)
    name = f"{reranker_name}-{model.store_variant}-{model.store_fingerprint()[:12]}"
    return index_path.parent / f"{index_path.name}.sidecars" / name


def partial_path(path: str | os.PathLike) -> Path:
    """Where the build of the sidecar at ``path`` grows until it is renamed into place."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


# ---- validation at open time -------------------------------------------------------------------------------------
def check_directory(path: str | os.PathLike) -> None:
    """Refuse a missing sidecar or an unfinished build with a message saying which, and what to do."""
    path = Path(path)
    if path.name.endswith(PARTIAL_SUFFIX) and path.is_dir():
        raise SidecarNotFoundError(
            f"{path} is an incomplete sidecar build (finalize never ran); resume the build to complete "
            f"{path.with_name(path.name[: -len(PARTIAL_SUFFIX)])}")
    if not path.exists():
        if partial_path(path).is_dir():
            raise SidecarNotFoundError(
                f"sidecar {path} does not exist: only the incomplete build {partial_path(path)} does "
                f"(interrupted before finalize); resume the build to complete it")
        raise SidecarNotFoundError(
            f"sidecar {path} does not exist; build it with `python -m pyserini_mores.sidecar build`")
    if not path.is_dir():
        raise SidecarNotFoundError(f"sidecar {path} is not a directory")


def check_expectations(manifest: Manifest, path: str | os.PathLike, *, model_fingerprint: str | None = None,
                       index: Mapping[str, Any] | None = None, dtype: str | None = None,
                       dim: int | None = None, format_version: int | None = None) -> None:
    """Raise :class:`SidecarMismatchError` when the sidecar was built for another model, index, dtype or dim.

    ``format_version`` is the sidecar format whose index identity ``manifest.index`` follows (default: the
    manifest's own; a sharded sidecar's is its shards'): format 1 identities cover docids only, so the index's
    ``content`` digest is left out of the comparison.
    """
    if format_version is None:  # a sharded manifest's own version is that of the sharded format, not its shards'
        format_version = manifest.format_version if isinstance(manifest, Manifest) else FORMAT_VERSION
    if model_fingerprint is not None and manifest.model_fingerprint != model_fingerprint:
        raise SidecarMismatchError(
            f"sidecar {path} was built for another model: its model fingerprint is "
            f"{short_hash(manifest.model_fingerprint)} (model_type={manifest.model.get('model_type')!r}, "
            f"store_variant={manifest.model.get('store_variant')!r}) but the model in use has fingerprint "
            f"{short_hash(model_fingerprint)}; the sidecar must be rebuilt for this model")
    if index is not None and json_normalized(_comparable(index, format_version)) != json_normalized(manifest.index):
        built, now = manifest.index, dict(index)
        if (built.get("content") and now.get("content") and built.get("num_docs") == now.get("num_docs")
                and built.get("signature") == now.get("signature")):
            raise SidecarContentMismatchError(
                f"sidecar {path} was built from other document texts than the index now holds (same docids in the "
                f"same rows, content digest {short_hash(built['content'])} then, {short_hash(now['content'])} now): "
                f"its vectors are stale", REBUILD_ADVICE.format(path=path))
        raise SidecarMismatchError(
            f"sidecar {path} was built for another index: its index identity is {manifest.index} but the index "
            f"in use is {dict(index)}; rows would not line up with Lucene docids, rebuild the sidecar for this index")
    if dtype is not None and manifest.dtype != str(dtype):
        raise SidecarMismatchError(
            f"sidecar {path} stores dtype {manifest.dtype} but {dtype} was expected")
    if dim is not None and manifest.dim != int(dim):
        raise SidecarMismatchError(
            f"sidecar {path} stores vectors of dim {manifest.dim} but dim {dim} was expected "
            f"(the model's store width)")


def _comparable(index: Mapping[str, Any], format_version: int) -> dict[str, Any]:
    """The part of an index identity that a sidecar of ``format_version`` records."""
    if format_version >= 2:
        return dict(index)
    return {key: value for key, value in index.items() if key != "content"}


REBUILD_ADVICE = ("rebuild it: `python -m pyserini_mores.sidecar build --index INDEX --reranker NAME --model MODEL "
                  "--output {path} --overwrite`")


def size_problems(manifest: Manifest, path: str | os.PathLike) -> list[str]:
    """Files whose size disagrees with the manifest: cheap (stat only). Empty when everything matches."""
    path = Path(path)
    problems = []
    for name, expected in manifest.expected_bytes().items():
        recorded = manifest.files[name].bytes
        if recorded != expected:
            problems.append(f"{name}: manifest records {recorded} bytes but its shape implies {expected} bytes")
            continue
        file = path / name
        try:
            actual = file.stat().st_size
        except FileNotFoundError:
            problems.append(f"{name}: file is missing ({file})")
            continue
        if actual != expected:
            state = "truncated" if actual < expected else "too long"
            dtype, shape = manifest.expected_layout()[name]
            row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
            count = (f"; it holds {actual // row_bytes} rows where the manifest implies {shape[0]}"
                     if row_bytes and actual % row_bytes == 0 else "")
            problems.append(f"{name}: file is {state}: expected {expected} bytes, found {actual} bytes{count} "
                            f"({file})")
    return problems


def offset_problems(offsets: np.ndarray, num_tokens: int, dtype: np.dtype | str = INDEX_DTYPE) -> list[str]:
    """How ``offsets`` (``offsets.bin``, of the size the manifest implies) break the format: not int64, first offset
    not 0, a decrease (the first row where one happens, with both values), last offset not ``num_tokens``. Empty when
    intact. Vectorised: one pass over the array, whose bytes stay in the page cache for the reads that follow."""
    problems = []
    try:
        int64 = np.dtype(dtype) == INDEX_DTYPE
    except TypeError:
        int64 = False
    if not int64:
        return [f"{OFFSETS}: dtype is {dtype!r}, not int64 ({INDEX_DTYPE.str})"]
    if len(offsets) == 0:
        return [f"{OFFSETS}: empty (it holds num_docs + 1 offsets, at least one)"]
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        problems.append(f"{OFFSETS}: first offset is {first}, not 0")
    # A comparison, not np.diff: one byte per row of temporary memory instead of eight.
    decreasing = np.less(offsets[1:], offsets[:-1])
    if decreasing.any():
        row = int(np.argmax(decreasing))
        problems.append(f"{OFFSETS}: offsets decrease at row {row} ({int(offsets[row])} -> {int(offsets[row + 1])})")
    if last != num_tokens:
        problems.append(f"{OFFSETS}: last offset is {last} but the manifest has num_tokens={num_tokens}")
    return problems


def window_problems(windows: np.ndarray, window_offsets: np.ndarray, offsets: np.ndarray,
                    num_windows: int) -> list[str]:
    """How a window map breaks the format: ``windows.bin`` not starting at 0, a document without a window (the
    first such row), not ending at ``num_windows``; ``window_offsets.bin`` not starting at 0 or decreasing; a row
    whose first window does not start at its offset (``offsets[i] != window_offsets[windows[i]]``), or the last
    window not ending at the last token. Empty when intact. Vectorised, like :func:`offset_problems`."""
    problems = []
    if len(windows) == 0 or int(windows[0]) != 0:
        problems.append(f"{WINDOWS}: first entry is {int(windows[0]) if len(windows) else None}, not 0")
    empty = np.less_equal(windows[1:], windows[:-1])
    if empty.any():
        row = int(np.argmax(empty))
        problems.append(f"{WINDOWS}: row {row} has no window ({int(windows[row])} -> {int(windows[row + 1])})")
    if len(windows) and int(windows[-1]) != num_windows:
        problems.append(f"{WINDOWS}: last entry is {int(windows[-1])} but the manifest has "
                        f"windows.num_windows={num_windows}")
    if len(window_offsets) == 0 or int(window_offsets[0]) != 0:
        problems.append(f"{WINDOW_OFFSETS}: first offset is not 0")
    decreasing = np.less(window_offsets[1:], window_offsets[:-1])
    if decreasing.any():
        k = int(np.argmax(decreasing))
        problems.append(f"{WINDOW_OFFSETS}: offsets decrease at window {k} ({int(window_offsets[k])} -> "
                        f"{int(window_offsets[k + 1])})")
    if problems:
        return problems
    starts = window_offsets[windows]  # in range: windows is 0 .. num_windows, increasing
    differ = np.not_equal(starts, offsets)
    if differ.any():
        row = int(np.argmax(differ))
        problems.append(f"{WINDOW_OFFSETS}: row {row}'s windows start at token {int(starts[row])} but "
                        f"{OFFSETS} puts the row at {int(offsets[row])} ({WINDOWS} or {WINDOW_OFFSETS} is damaged)")
    return problems


# ---- block checksums ---------------------------------------------------------------------------------------------
class BlockHasher:
    """Incremental "sha256-blocks" checksum that can be restored from saved block digests after a crash.

    The state is the list of finished block digests plus a running hash of the current (unfinished) block.
    """

    def __init__(self, block_bytes: int = DEFAULT_BLOCK_BYTES):
        if block_bytes <= 0:
            raise ValueError("block_bytes must be positive")
        self.block_bytes = int(block_bytes)
        self.block_digests: list[bytes] = []
        self._current = hashlib.sha256()
        self._current_bytes = 0

    @property
    def num_bytes(self) -> int:
        return len(self.block_digests) * self.block_bytes + self._current_bytes

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(self.block_bytes - self._current_bytes, len(view))
            self._current.update(view[:take])
            self._current_bytes += take
            view = view[take:]
            if self._current_bytes == self.block_bytes:
                self.block_digests.append(self._current.digest())
                self._current = hashlib.sha256()
                self._current_bytes = 0

    def hexdigest(self) -> str:
        total = hashlib.sha256()
        for digest in self.block_digests:
            total.update(digest)
        if self._current_bytes:
            total.update(self._current.digest())
        return total.hexdigest()

    @classmethod
    def restore(cls, file: Path, length: int, block_bytes: int, saved_digests: list[bytes]) -> BlockHasher:
        """The hasher of the first ``length`` bytes of ``file``, re-reading only what ``saved_digests`` lacks."""
        hasher = cls(block_bytes)
        full_blocks = length // block_bytes
        hasher.block_digests = list(saved_digests[:full_blocks])
        with open(file, "rb") as stream:
            stream.seek(len(hasher.block_digests) * block_bytes)
            _feed(hasher, stream, length - hasher.num_bytes)
        return hasher


def _feed(hasher: BlockHasher, stream: BinaryIO, count: int, buffer_bytes: int = 8 * 1024 * 1024) -> None:
    while count > 0:
        data = stream.read(min(buffer_bytes, count))
        if not data:
            raise SidecarCorruptError(f"{getattr(stream, 'name', 'file')} ended {count} bytes early")
        hasher.update(data)
        count -= len(data)


def file_checksum(file: str | os.PathLike, block_bytes: int = DEFAULT_BLOCK_BYTES) -> str:
    """The "sha256-blocks" checksum of a whole file, streamed (constant memory, any file size)."""
    hasher = BlockHasher(block_bytes)
    with open(file, "rb") as stream:
        _feed(hasher, stream, os.fstat(stream.fileno()).st_size)
    return hasher.hexdigest()
