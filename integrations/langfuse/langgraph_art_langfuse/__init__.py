"""Langfuse: every rollout as a trace (node spans, LLM generations, tool calls), rewards as scores, and scores
given in Langfuse back as rewards. Its own distribution, ``langgraph-art-langfuse`` (``integrations/langfuse``);
core finds it through entry points (the ``langfuse`` sink, ``langgraph-art export langfuse``).

- ``LangfuseExporter(store)``: sends what the store holds and Langfuse lacks (exactly once; retry-safe).
  ``Trainer(..., langfuse=True)`` (or just the ``LANGFUSE_*`` variables) runs one per training step.
- ``LangfuseScoreReward("user-feedback")``: a reward read from the scores on each run's trace.
- ``trace_id(trajectory.id)``: the Langfuse trace id of a run.
"""

from langgraph_art_langfuse.connection import LangfuseSettings
from langgraph_art_langfuse.exporter import ExportReport, LangfuseExporter
from langgraph_art_langfuse.reward import LangfuseScoreReward
from langgraph_art_langfuse.traces import trace_id

__all__ = ["ExportReport", "LangfuseExporter", "LangfuseScoreReward", "LangfuseSettings", "trace_id"]
