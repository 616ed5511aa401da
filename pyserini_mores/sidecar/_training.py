"""What every codec trained by k-means over 256 centroids (``pq``, ``opq``, ``rq``) checks of its training sample."""
from __future__ import annotations

import logging

CENTROIDS = 256  # one byte per code
POINTS_PER_CENTROID = 39  # below this many training points per centroid k-means is poorly fit (faiss's advice)

logger = logging.getLogger(__name__)


def require_training_points(codec: str, count: int) -> None:
    """Refuse fewer token vectors than centroids (``ValueError``); warn, once through logging, below
    :data:`POINTS_PER_CENTROID` per centroid."""
    if count < CENTROIDS:
        raise ValueError(f"the {codec} codec needs at least {CENTROIDS} token vectors to train, got {count}")
    warn_if_few_training_points(codec, count)


def warn_if_few_training_points(codec: str, count: int) -> None:
    wanted = POINTS_PER_CENTROID * CENTROIDS
    if count < wanted:
        logger.warning("training the %s codec on %d token vectors (k-means fits 256 centroids well from %d on): "
                       "expect a larger reconstruction error", codec, count, wanted)
