"""The codec every shard of a sharded build adopts: trained once, before the shards are encoded, on documents drawn
across the whole collection (:mod:`.build`), and kept in the build's directory as two files:

* ``trained-codec.bin``: its parameters, flat little-endian float32 (what a sidecar's ``codec.bin`` holds);
* ``trained-codec.json``: what it is (the manifest's ``codec`` entry: name, options, sizes), the sha256 of the
  parameters, what it was trained for (model, index identity, precision, windows) and on which documents. Written
  last, atomically, like a manifest: a half-written codec is never mistaken for a whole one.

A shard's build id (:func:`.build.shard_build_id`) includes the codec's name, options and parameter checksum, so
shards that adopted different codecs cannot be assembled together. Numpy and JSON only (faiss when the codec is made).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from .._io import write_bytes_atomic, write_json_atomic
from .codecs import TokenCodec, codec_from_manifest
from .format import (
    CODEC_PARAMETER_DTYPE,
    SidecarCorruptError,
    SidecarMismatchError,
    SidecarNotFoundError,
    json_normalized,
    short_hash,
)

TRAINED_CODEC = "trained-codec.json"
TRAINED_CODEC_PARAMETERS = "trained-codec.bin"
FORMAT_NAME = "pyserini-mores-trained-codec"
FORMAT_VERSION = 1
# What a trained codec is checked against before a build adopts it, in the order a difference is reported.
TRAINED_FOR = ("model", "index", "precision", "windows")


@dataclass(frozen=True)
class TrainedCodec:
    """A codec trained for a sharded build, as saved in its directory.

    Attributes:
        directory: where ``trained-codec.json`` and ``trained-codec.bin`` lie.
        entry: the sidecar manifest's ``codec`` entry (``name``, ``code_size``, ``parameter_count``, ``options``,
            ``trained_on_tokens``, ``faiss_version``).
        dim: the width of the token vectors it codes.
        parameters: ``[parameter_count]`` float32, what :meth:`.codecs.TokenCodec.parameters` gives.
        trained_for: ``model``, ``index``, ``precision``, ``windows`` of the vectors it was trained on.
        sample: the training sample: ``documents``, ``tokens``, ``seed`` and the ``rows`` drawn.
    """

    directory: Path
    entry: dict[str, Any]
    dim: int
    parameters: np.ndarray
    trained_for: dict[str, Any]
    sample: dict[str, Any]

    @property
    def path(self) -> Path:
        return self.directory / TRAINED_CODEC

    @property
    def name(self) -> str:
        return str(self.entry["name"])

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.entry.get("options") or {})

    @property
    def trained_on(self) -> int:
        return int(self.entry.get("trained_on_tokens", 0))

    @property
    def sha256(self) -> str:
        return parameters_sha256(self.parameters)

    def identity(self) -> dict[str, Any]:
        """What a shard build id holds of the codec: name, options and the sha256 of its parameters."""
        return {"name": self.name, "options": self.options, "parameters": self.sha256}

    def describe(self) -> str:
        """``opq (pq_subquantizers=48), parameters sha256 0123456789ab``: for messages."""
        settings = ", ".join(f"{key}={value}" for key, value in self.options.items() if key != "sample_tokens")
        return f"{self.name}{f' ({settings})' if settings else ''}, parameters sha256 {short_hash(self.sha256)}"

    def codec(self) -> TokenCodec:
        """The trained :class:`.codecs.TokenCodec` (checks the parameters like a sidecar's ``codec.bin``)."""
        return codec_from_manifest(self.entry, self.dim, self.parameters, source=str(self.path))


def parameters_sha256(parameters: np.ndarray) -> str:
    """sha256 of the parameters' little-endian float32 bytes."""
    return hashlib.sha256(np.ascontiguousarray(parameters, dtype=CODEC_PARAMETER_DTYPE).tobytes()).hexdigest()


def trained_codec_directory(location: str | os.PathLike) -> Path:
    """The directory of a trained codec given as that directory or as its ``trained-codec.json``."""
    location = Path(location)
    return location.parent if location.name == TRAINED_CODEC else location


def save_trained_codec(directory: str | os.PathLike, codec: TokenCodec, *, trained_for: Mapping[str, Any],
                       sample: Mapping[str, Any]) -> TrainedCodec:
    """Save the trained ``codec`` in ``directory`` (created if needed): parameters first, then the JSON that
    describes them, each atomically. Returns it as :func:`load_trained_codec` reads it back."""
    directory = Path(directory)
    parameters = np.ascontiguousarray(codec.parameters(), dtype=CODEC_PARAMETER_DTYPE)
    write_bytes_atomic(directory / TRAINED_CODEC_PARAMETERS, parameters.tobytes())
    record = json_normalized({
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "codec": codec.manifest_entry(), "dim": codec.dim,
        "parameters": {"file": TRAINED_CODEC_PARAMETERS, "bytes": parameters.nbytes,
                       "sha256": parameters_sha256(parameters)},
        "trained_for": dict(trained_for), "sample": dict(sample),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "library": {"name": "pyserini_mores", "version": __version__}})
    write_json_atomic(directory / TRAINED_CODEC, record)
    return TrainedCodec(directory, record["codec"], codec.dim, parameters, record["trained_for"], record["sample"])


def trained_codec_exists(location: str | os.PathLike) -> bool:
    return (trained_codec_directory(location) / TRAINED_CODEC).is_file()


def load_trained_codec(location: str | os.PathLike) -> TrainedCodec:
    """The trained codec saved in ``location`` (its directory, or its ``trained-codec.json``).

    Raises:
        SidecarNotFoundError: no ``trained-codec.json`` there.
        SidecarCorruptError: a file that is unreadable, of the wrong size or checksum, or describes no codec.
    """
    directory = trained_codec_directory(location)
    file = directory / TRAINED_CODEC
    if not file.is_file():
        raise SidecarNotFoundError(f"no trained codec at {directory}: {file} does not exist")
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SidecarCorruptError(f"{file} cannot be read: {error}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME:
        raise SidecarCorruptError(f"{file}: format is {record.get('format') if isinstance(record, dict) else None!r}, "
                                  f"not {FORMAT_NAME!r}")
    if record.get("format_version") != FORMAT_VERSION:
        raise SidecarMismatchError(f"{file}: trained codec format_version is {record.get('format_version')!r}, this "
                                   f"pyserini_mores reads version {FORMAT_VERSION}")
    for name, kind in (("codec", dict), ("dim", int), ("parameters", dict), ("trained_for", dict), ("sample", dict)):
        if not isinstance(record.get(name), kind):
            raise SidecarCorruptError(f"{file}: field '{name}' is missing or not a {kind.__name__}")
    described = record["parameters"]
    data = directory / TRAINED_CODEC_PARAMETERS
    size = data.stat().st_size if data.is_file() else None
    if size != described.get("bytes"):
        found = "missing" if size is None else f"{size} bytes"
        raise SidecarCorruptError(f"{data} is {found}, {file} records {described.get('bytes')} bytes; train the codec "
                                  "again (--train-codec --overwrite)")
    parameters = np.fromfile(data, dtype=CODEC_PARAMETER_DTYPE)
    if parameters_sha256(parameters) != described.get("sha256"):
        raise SidecarCorruptError(f"{data} does not match its sha256 in {file}; train the codec again "
                                  "(--train-codec --overwrite)")
    trained = TrainedCodec(directory, record["codec"], record["dim"], parameters, record["trained_for"],
                           record["sample"])
    trained.codec()  # the entry describes a codec and the parameters fit it (SidecarCorruptError otherwise)
    return trained


def trained_codec_problem(trained: TrainedCodec, codec: TokenCodec, trained_for: Mapping[str, Any]) -> str | None:
    """How ``trained`` differs from the codec a build asks for (``codec``, untrained: its name and resolved options)
    and from the vectors it encodes (``trained_for``), or None. Names the first difference."""
    wanted = {"codec": codec.name, "codec options": json_normalized(codec.options), "dim": codec.dim}
    found = {"codec": trained.name, "codec options": trained.options, "dim": trained.dim}
    for key in TRAINED_FOR:
        wanted[key], found[key] = json_normalized(trained_for.get(key)), trained.trained_for.get(key)
    for what, expected in wanted.items():
        if found[what] != expected:
            label, actual = what, found[what]
            if what == "model" and isinstance(actual, dict) and isinstance(expected, dict):
                label, actual, expected = ("model fingerprint", short_hash(str(actual.get("fingerprint"))),
                                           short_hash(str(expected.get("fingerprint"))))
            return (f"{trained.path} is a codec trained for another build: its {label} is {actual}, this build's is "
                    f"{expected}")
    return None


__all__ = ["TRAINED_CODEC", "TRAINED_CODEC_PARAMETERS", "TrainedCodec", "load_trained_codec", "parameters_sha256",
           "save_trained_codec", "trained_codec_directory", "trained_codec_exists", "trained_codec_problem"]
