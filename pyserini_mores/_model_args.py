"""Model config overrides written as ``KEY=VALUE`` (``--model-arg``): read from command lines, and printed into the
commands that hints and pipelines show, so that reading a printed one back gives the same values."""
from __future__ import annotations

import json
from typing import Any

PYTHON_CONSTANTS = {"True": True, "False": False, "None": None}


def format_model_arg(key: str, value: Any) -> str:
    """``KEY=VALUE`` as :func:`parse_model_arg` reads it back: plain strings bare, everything else JSON."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def parse_model_arg(item: str) -> tuple[str, Any]:
    """``"reuse=s1"`` → ``("reuse", "s1")``; ``"n_interaction_blocks=2"`` → ``("n_interaction_blocks", 2)``.

    Raises:
        ValueError: ``item`` is not ``KEY=VALUE``.
    """
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--model-arg expects KEY=VALUE, got '{item}'")
    if value in PYTHON_CONSTANTS:  # tied=False as a Python user writes it, not the truthy string "False"
        return key.strip(), PYTHON_CONSTANTS[value]
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value  # a bare string such as s1
