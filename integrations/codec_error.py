"""Reconstruction error of sidecar codecs on a sidecar's real token vectors.

Each codec is trained on the tokens of random documents (fixed seed) and measured on the last 10,000 tokens of the
other random documents: the mean relative error ||x' - x|| / ||x|| and the mean cosine of decoded and stored vectors.

    python integrations/codec_error.py SIDECAR [--train-tokens 32768] [--test-tokens 10000]
"""
from __future__ import annotations

import argparse

import numpy as np

from pyserini_mores.sidecar import open_sidecar
from pyserini_mores.sidecar.codecs import TokenCodec

CODECS = [("pq", {"pq_subquantizers": 48}), ("residual", {"num_centroids": 1024}),
          ("residual", {"num_centroids": 1024, "nbits": 2, "residual_dims": 184})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sidecar")
    parser.add_argument("--train-tokens", type=int, default=32768)
    parser.add_argument("--test-tokens", type=int, default=10000)
    args = parser.parse_args()
    with open_sidecar(args.sidecar) as reader:
        order = np.random.default_rng(0).permutation(reader.num_docs)
        tokens = np.concatenate([np.asarray(reader.get(int(row)), dtype=np.float32) for row in order])
        dim = reader.dim
    train, test = tokens[:args.train_tokens], tokens[-args.test_tokens:]
    print(f"{args.sidecar}: dim {dim}, mean norm {np.linalg.norm(test, axis=1).mean():.4f}")
    for name, options in CODECS:
        codec = TokenCodec(name, dim, **options)
        codec.train(train)
        decoded = codec.decode(codec.encode(test))
        norms = np.linalg.norm(test, axis=1)
        error = (np.linalg.norm(decoded - test, axis=1) / norms).mean()
        cosine = ((decoded * test).sum(axis=1) / np.linalg.norm(decoded, axis=1) / norms).mean()
        print(f"{name} {options} {codec.code_size} B/token: relative error {error:.4f}, cosine {cosine:.4f}")


if __name__ == "__main__":
    main()
