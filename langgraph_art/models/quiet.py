"""``quiet_transformers``: our own loading and saving without transformers' bars and internal warnings. A module of its
own: the loaders that build models (``tiny``, ``gguf``) and the one that resolves names to them (``loading``) all use
it, and none of them imports another for it."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Inside our own loading and saving: no transformers progress bars ("Loading weights", "Writing model shards")
    and no FutureWarnings from transformers or peft about their own internals. The user's settings come back after:
    nothing changes process-wide."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)(\.|$)")
            yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
