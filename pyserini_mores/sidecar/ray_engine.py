"""Distributed sidecar builds on a Ray cluster: one Ray task per shard (retried when it fails or its worker dies),
finished shards skipped on a re-run; the driver then assembles the shards (:mod:`.build`, :mod:`.assemble`).

Ray is optional: ``pip install 'pyserini-mores[ray]'``. On a real cluster every node needs pyserini-mores installed
and must see the index, the model and the output directory at the same paths (a shared filesystem).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from .._jvm import jvm_signal_handlers_kept
from .format import SidecarError
from .shards import ShardPlan

logger = logging.getLogger(__name__)

RAY_INSTALL_HINT = "pip install 'pyserini-mores[ray]'"


def import_ray():
    """The ``ray`` module, or an :class:`ImportError` that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"--engine ray needs Ray, which is not installed ({error}); install it with: "
                          f"{RAY_INSTALL_HINT}") from None
    return ray


def build_shards_on_ray(options: Any, plan: ShardPlan, shard_task: Callable[[Any, int, str, str], str], *,
                        address: str | None = None, max_retries: int = 3, cpus_per_task: float = 1.0,
                        gpus_per_task: float = 0.0) -> list[int]:
    """Build the shards ``plan.todo`` as parallel Ray tasks; returns the shards built.

    Uses the Ray instance already initialized in this process, else connects to ``address`` (or starts a local
    instance, shut down at the end). Each task runs ``shard_task(options, shard, path, build_id)`` (the build's
    :func:`.build.build_shard`), which loads the model, opens the index and writes one shard directory; ``options``
    travels to the workers pickled, so it holds plain values. Ray retries a task up to ``max_retries`` times, and a
    retry resumes the shard's ``.partial`` build where the failed attempt committed it. Each task reserves
    ``cpus_per_task`` CPUs and ``gpus_per_task`` GPUs (Ray then makes only those GPUs visible to it).

    Raises:
        SidecarError: when shards still fail after their retries (the finished ones are kept for a re-run).
    """
    ray = import_ray()
    if not plan.todo:
        return []
    started_here = not ray.is_initialized()
    if started_here:
        with jvm_signal_handlers_kept():  # Ray's crash handlers would take the faults the JVM makes on purpose
            if address:
                ray.init(address=address)
            else:  # a throwaway local instance needs no dashboard
                ray.init(include_dashboard=False)
    elif address:
        logger.warning("Ray is already initialized in this process; ignoring --address %s", address)
    try:
        task = ray.remote(shard_task).options(
            num_cpus=cpus_per_task, num_gpus=gpus_per_task, max_retries=max_retries, retry_exceptions=True,
            name="sidecar-shard")
        shard_of = {task.remote(options, shard, str(plan.paths[shard]), plan.build_id): shard for shard in plan.todo}
        failures: dict[int, BaseException] = {}
        with tqdm(total=len(shard_of), unit="shard", desc=f"sidecar {plan.output.name} on Ray") as bar:
            remaining = list(shard_of)
            while remaining:
                done, remaining = ray.wait(remaining, num_returns=1)
                for ref in done:
                    try:
                        ray.get(ref)
                    except Exception as error:  # a RayTaskError wrapping the task's exception, or a lost worker
                        failures[shard_of[ref]] = error
                    bar.update(1)
    finally:
        if started_here:
            with jvm_signal_handlers_kept():  # (shutdown resets them to the default action, which kills)
                ray.shutdown()
    if failures:
        first_shard, first_error = min(failures.items())
        reason = str(first_error).strip().splitlines()[-1] if str(first_error).strip() else repr(first_error)
        others = f" (failed: shards {', '.join(map(str, sorted(failures)))})" if len(failures) > 1 else ""
        raise SidecarError(
            f"{len(failures)} of {len(shard_of)} shard tasks failed after {max_retries} retries each{others}; "
            f"shard {first_shard}: {reason}. The finished shards are kept: run the same command again to build "
            f"only the missing ones")
    return list(plan.todo)
