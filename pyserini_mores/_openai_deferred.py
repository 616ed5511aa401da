"""Pyserini's OpenAI module without OpenAI credentials.

``pyserini.encode._openai`` builds an ``openai.OpenAI`` client at import, and the OpenAI SDK refuses to build one
without an API key: every Pyserini search, index and eval module imports it, so without this no program could use
Pyserini without an OpenAI key. While that module runs, a client the SDK refuses becomes a
:class:`DeferredOpenAIClient`, built on first use from the environment of that moment; nothing is put into
``os.environ``.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator


class DeferredOpenAIClient:
    """Stands for an ``openai.OpenAI(*args, **kwargs)`` that could not be built yet: the first attribute read builds
    it (empty ``api_key``/``organization`` arguments are left to the SDK's environment variables) and delegates."""

    def __init__(self, factory, args: tuple, kwargs: dict) -> None:
        self._factory, self._args = factory, args
        self._kwargs = {name: value for name, value in kwargs.items()
                        if not (name in ("api_key", "organization") and not value)}
        self._client = None

    def __getattr__(self, name: str):
        if self._client is None:
            self._client = self._factory(*self._args, **self._kwargs)  # (raises the SDK's own error if still no key)
        return getattr(self._client, name)


@contextlib.contextmanager
def openai_clients_deferred() -> Iterator[None]:
    """While the block runs, ``openai.OpenAI(...)`` returns a :class:`DeferredOpenAIClient` where the SDK refuses."""
    try:
        import openai
    except ImportError:  # (the module being imported then fails with its own, accurate error)
        yield
        return
    client_class = openai.OpenAI

    def client_or_deferred(*args, **kwargs):
        try:
            return client_class(*args, **kwargs)
        except openai.OpenAIError:
            return DeferredOpenAIClient(client_class, args, kwargs)

    openai.OpenAI = client_or_deferred
    try:
        yield
    finally:
        openai.OpenAI = client_class
