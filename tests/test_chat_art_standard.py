"""LangChain's standard test suites run against ChatART: proof that it is a drop-in chat model."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.unit_tests import ChatModelUnitTests

from langgraph_art.capture.chat_model import ChatART
from tests.helpers import ServedChatModelSuite


class TestChatARTUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatART]:
        return ChatART

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "agent@3", "base_url": "http://127.0.0.1:9/v1", "temperature": 0.5}

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        return (
            {"LANGGRAPH_ART_API_KEY": "env-key", "LANGGRAPH_ART_BASE_URL": "http://127.0.0.1:9/v1"},
            {"model": "agent"},
            {"openai_api_key": "env-key", "openai_api_base": "http://127.0.0.1:9/v1"},
        )

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True


@pytest.mark.integration
class TestChatARTIntegration(ServedChatModelSuite):
    """The standard integration suite against the embedded tiny service.

    The tiny model is random-init: tests that need a model which understands the prompt are expected to fail below,
    each with its reason; everything about the protocol (invoke/stream/batch, async, usage metadata, stop,
    tool-message shapes, callbacks) runs for real, and so do structured output, JSON mode and forced tool choice,
    which the service enforces by constrained decoding whatever the model would say.
    """

    @pytest.fixture(autouse=True)
    def _service(self, server: Any) -> None:
        type(self)._base_url = server.base_url

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # room for a forced tool call or a small JSON object: the service closes one cut short, but not below its
        # shortest form. Greedy (temperature 0): every answer is fixed, so each expected failure below fails every
        # time (sampled at the service's default 1.0, 4 of them passed now and then)
        return {"model": "tiny", "base_url": self._base_url, "max_tokens": 40, "max_retries": 0, "temperature": 0.0}

    @property
    def model_override_value(self) -> str:
        return "weather@1"  # another model served by the same service (a LoRA adapter)

    # -- tests that need a model which understands the prompt (the tiny model is random-init) ---------------
    # They run and are expected to fail, greedily the same way every time, on the test's assertion (xfail_strict: one
    # that passes fails the suite; raises=AssertionError: an error on the way, a 500 say, fails it too). The protocol
    # they exercise is covered with a trained adapter in tests/test_server_openai.py and tests/test_capture_graphs.py.
    # test_bind_runnables_as_tools and test_tool_calling_with_no_arguments pass here: greedy, the random model writes
    # a non-empty answer_style and makes one call (sampled at 1.0 it sometimes did not), so they run unmarked.
    _SMART = "needs a model that follows tool instructions; the tiny random-init model cannot"
    _ARGS = "the forced call's arguments are valid, but the random model's greedy ones are not the input=3 wanted"

    @pytest.mark.xfail(reason=_ARGS, raises=AssertionError)
    def test_tool_calling(self, model: Any) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=_ARGS, raises=AssertionError)
    async def test_tool_calling_async(self, model: Any) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=_SMART, raises=AssertionError)
    def test_agent_loop(self, model: Any) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason=_SMART, raises=AssertionError)
    def test_unicode_tool_call_integration(self, model: Any, *args: Any, **kwargs: Any) -> None:
        super().test_unicode_tool_call_integration(model, *args, **kwargs)


@pytest.mark.integration
class TestChatARTInProcessIntegration(TestChatARTIntegration):
    """The same suite with the in-process endpoint a LocalBackend gives ChatART (``serve/inprocess/``):
    non-streaming calls skip the openai SDK and the app, so it must be as drop-in as the HTTP path."""

    @pytest.fixture(autouse=True)
    def _service(self, server: Any) -> None:
        type(self)._base_url = server.base_url
        type(self)._clients = server.in_process_clients()

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {**super().chat_model_params, **self._clients}

    def test_the_direct_path_answers(self, model: Any) -> None:
        endpoint = model.in_process
        before = endpoint.answered
        answer = model.invoke("hello")
        assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 0, answer
        assert endpoint.answered == before + 1


@pytest.mark.integration
@pytest.mark.slow
class TestChatARTRealModelIntegration(ServedChatModelSuite):
    """The standard integration suite against SmolLM2-135M-Instruct (``smollm2-135m``, its bundled ChatML tool-call
    template), in process as ``LocalBackend`` gives it: a real model answers, so the tool-calling tests mean what they
    say. What a 135M model still cannot do is marked below, each with what it does instead."""

    @pytest.fixture(autouse=True)
    def _service(self, smol_server: Any) -> None:
        type(self)._base_url = smol_server.base_url
        type(self)._clients = smol_server.in_process_clients()

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "smollm2-135m", "base_url": self._base_url, "max_tokens": 48, "max_retries": 0,
                "temperature": 0.0, **self._clients}  # fmt: skip

    @property
    def model_override_value(self) -> str:
        return "lora@1"  # a LoRA adapter served by the same service

    # Every test the tiny model fails passes here but one (measured: issue 26). At temperature 0 the answer is fixed.
    @pytest.mark.xfail(
        reason="under tool_choice='auto' SmolLM2-135M answers 'What is the weather in San Francisco?' from memory in "
        "prose; forced, it calls get_weather(location='San Francisco, CA')",
        raises=AssertionError,
    )
    def test_agent_loop(self, model: Any) -> None:
        super().test_agent_loop(model)
