"""Requests from this process to the embedded server, handed to its app directly: no sockets, no HTTP parsing. All
of it here: ``transport`` (an httpx transport through the ASGI app, for the openai SDK's HTTP clients),
``completions`` (the endpoint that answers ChatART's non-streaming completions with the route's own code) and
``client`` (what stands in for the SDK's resources inside ChatART). ``ChatART`` knows only the endpoint's methods
(``wrap``, ``wraps``, ``through_sdk``); ``EmbeddedServer.in_process_clients`` builds both for a ``LocalBackend``.
"""

from langgraph_art.serve.inprocess.completions import InProcessCompletions
from langgraph_art.serve.inprocess.transport import InProcessTransport

__all__ = ["InProcessCompletions", "InProcessTransport"]
