"""ChatART samples at temperature 0.7 unless told otherwise (issue 35: at the server's 1.0 a small model's tool
arguments are noise), and the trainer recomputes logprobs at the temperature each turn was sampled with."""

from __future__ import annotations

from typing import Any

import pytest

from langgraph_art.capture.chat_model import ChatART
from langgraph_art.train.tokenize import _sampling_temperature

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("given", "sent", "trained"),
    [({}, 0.7, 0.7), ({"temperature": 1.0}, 1.0, 1.0), ({"temperature": None}, None, 1.0)],
    ids=["default", "given", "none: the server's default"],
)
def test_chat_art_samples_at_0_7_unless_told(server: Any, given: dict[str, Any], sent: Any, trained: float) -> None:
    llm = ChatART(base_url=server.base_url, model="tiny", max_tokens=2, max_retries=0, **given)
    assert llm.temperature == sent
    llm.invoke("hi")
    (turn,) = llm.recorder.unclaimed()  # type: ignore[union-attr]
    assert turn.params.get("temperature") == sent  # what the request carried
    assert _sampling_temperature(turn) == trained  # what the update divides the logits by
