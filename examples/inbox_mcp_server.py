"""The email agent's inbox as an MCP server over stdio (the ``mcp`` SDK's FastMCP): ``search_inbox``, ``read_email``
and ``answer``, the same functions ``email_agent.py`` binds as LangChain tools.

    python examples/inbox_mcp_server.py INBOX.sqlite [CALLS.jsonl]

An MCP client starts it as a child process (``email_agent_mcp.py`` does, through ``langchain-mcp-adapters``). With a
second argument every call is appended to that file as a JSON line (name, arguments), so a test can see the calls
went through this process.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from email_agent import inbox_tools
from mcp.server.fastmcp import FastMCP


def logged(fn: Any, name: str, calls: Path | None) -> Any:
    @functools.wraps(fn)
    def call(**arguments: Any) -> str:
        if calls is not None:
            with calls.open("a") as out:
                out.write(json.dumps({"name": name, "arguments": arguments}) + "\n")
        return str(fn(**arguments))

    return call


def build_server(db: Path, calls: Path | None = None) -> FastMCP:
    """An MCP server whose tools are the inbox's at ``db``."""
    server = FastMCP("inbox")
    for name, tool in inbox_tools(db).items():
        server.add_tool(logged(tool.func, name, calls), name=name, description=tool.description)
    return server


if __name__ == "__main__":
    build_server(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None).run("stdio")
