"""The email agent with its tools served by an MCP server: ``inbox_mcp_server.py`` runs as a child process (stdio),
``langchain-mcp-adapters`` turns its tools into LangChain tools, and the same graph, rewards and trainer as
``email_agent.py`` train on them. Nothing in langgraph-art knows the tools are remote: the graph's ``ToolNode`` awaits
them, the trajectories hold their results like any other tool's.

    python examples/email_agent_mcp.py              # SmolLM2-135M, offline, the email agent's defaults
    python examples/email_agent_mcp.py --base-model tiny --steps 2      # a quick look

The MCP session lives as long as training does, so the trainer runs on this script's event loop (``atrain``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import email_agent as agent
from harness import held_out_trainer, parse_args, report, trainable_model, use_threads
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

SERVER = Path(__file__).with_name("inbox_mcp_server.py")


def mcp_client(db: Path, calls: Path | None = None) -> MultiServerMCPClient:
    """A client of the inbox server at ``db``, started with this Python (``calls``: where it logs each call)."""
    args = [str(SERVER), str(db), *([str(calls)] if calls else [])]
    return MultiServerMCPClient({"inbox": {"transport": "stdio", "command": sys.executable, "args": args}})


async def amain(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    calls_option = ("--mcp-calls", {"default": None, "help": "a file where the MCP server logs each call (JSON lines)"})
    options = [*agent.OPTIONS, calls_option]
    args = parse_args(__doc__ or "", argv, options=options, **agent.DEFAULTS)
    use_threads(args)
    questions, local_tools = agent.open_inbox(args.home, args.seed)
    train, held_out = agent.split(questions, local_tools, args.held_out)  # the worked example: same tools, in process
    db = agent.inbox_path(args.home, args.seed)
    async with mcp_client(db, Path(args.mcp_calls) if args.mcp_calls else None).session("inbox") as session:
        tools = {tool.name: tool for tool in await load_mcp_tools(session)}
        with trainable_model(args, f"email-agent-mcp-{args.seed}", "examples") as (model, llm):
            rewards = [agent.correct_answer, agent.read_the_email]
            graph = agent.build_graph(llm, tools)
            trainer = held_out_trainer(graph, model, args, rewards=rewards, held_out=held_out,
                                       eval_rewards=agent.EVAL_REWARDS)  # fmt: skip
            history = await trainer.atrain(train, steps=args.steps)
            summary = report(trainer, history, echo=echo, shown="a held-out run")
            summary["held_out"] = agent.held_out_summary(trainer)
            for row in summary["held_out"]:
                echo(json.dumps(row))
            return summary


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    return asyncio.run(amain(argv, echo=echo))


if __name__ == "__main__":
    main()
