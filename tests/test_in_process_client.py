"""ChatART on a LocalBackend reaches the embedded server in process (no sockets) with HTTP's exact semantics:
responses, streaming (sync and async), errors as the openai SDK raises them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

import langgraph_art as art
from langgraph_art.serve.inprocess import InProcessTransport


def test_chat_art_on_a_local_backend_talks_in_process(tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="m", project="p").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=6)
        assert isinstance(llm.root_client._client._transport, InProcessTransport)
        assert isinstance(llm.root_async_client._client._transport, InProcessTransport)
        reply = llm.invoke("hello")
        assert reply.response_metadata["logprobs"]["content"]  # token ids and logprobs came through
        chunks = list(llm.stream("hello"))
        assert len(chunks) > 1 and "".join(str(c.content) for c in chunks) is not None

        async def both() -> tuple[object, list[object]]:
            one = await llm.ainvoke("hi")
            streamed = [c async for c in llm.astream("hi")]
            return one, streamed

        one, streamed = asyncio.run(both())
        assert one is not None and len(streamed) > 1
        missing = art.ChatART(model=model, max_tokens=2, max_retries=0).bind(model="nobody")
        with pytest.raises(openai.NotFoundError, match="nobody"):
            missing.invoke("hello")
        slow = art.ChatART(model=model, max_tokens=400, timeout=0.01, max_retries=0, extra_body={"ignore_eos": True})
        with pytest.raises(openai.APITimeoutError):  # a custom transport must enforce httpx's timeout itself
            slow.invoke("hello")
        with pytest.raises(openai.APITimeoutError):
            asyncio.run(slow.ainvoke("hello"))
        assert llm.invoke("hello").content is not None  # and the server goes on
        remote = art.ChatART(model=model, base_url="http://127.0.0.1:9/v1", max_retries=0)  # the user's own URL
        assert not isinstance(remote.root_client._client._transport, InProcessTransport)


def test_a_stream_the_client_leaves_stops_decoding(tmp_path: Path) -> None:
    import time

    with art.LocalBackend(home=tmp_path) as backend:
        model = art.TrainableModel(name="m", project="p").register(backend)
        llm = art.ChatART(model=model, max_tokens=2000, extra_body={"ignore_eos": True})

        async def leave_async() -> None:
            index = 0
            async for _ in llm.astream("hello"):
                index += 1
                if index == 3:
                    break

        for leave in (lambda: next(iter(llm.stream("hello"))), lambda: asyncio.run(leave_async())):
            leave()
            time.sleep(0.3)  # the disconnect reaches the app, the engine drops the row at its next step
            cpu = time.process_time()
            time.sleep(1.0)
            assert time.process_time() - cpu < 0.5  # 2000 tokens still decoding would keep a core busy
