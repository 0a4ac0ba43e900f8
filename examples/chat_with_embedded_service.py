"""Start the inference service inside this process and use it from LangChain, with exact token ids and logprobs.

OMP_NUM_THREADS=1 python examples/chat_with_embedded_service.py
"""

from __future__ import annotations

from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from langgraph_art.serve import EmbeddedServer


def main() -> None:
    with EmbeddedServer("tiny") as server:  # builds the offline tiny model on first use
        llm = ChatOpenAI(
            base_url=server.base_url,
            api_key=SecretStr("unused"),
            model="tiny",
            logprobs=True,
            max_completion_tokens=16,
            use_responses_api=False,
        )
        reply = llm.invoke("Hello there!")
        for entry in reply.response_metadata["logprobs"]["content"]:
            print(f"{entry['token_id']:>6} {entry['logprob']:>9.4f} {entry['token']!r}")


if __name__ == "__main__":
    main()
