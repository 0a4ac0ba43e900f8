"""``langgraph_art.integrations.langfuse``: the documented import path of the Langfuse integration, which is its
own distribution (``langgraph-art-langfuse``, ``integrations/langfuse/`` in the repository; installed by
``pip install 'langgraph-art[langfuse]'``). Everything here comes from ``langgraph_art_langfuse``."""

try:
    from langgraph_art_langfuse import (
        ExportReport,
        LangfuseExporter,
        LangfuseScoreReward,
        LangfuseSettings,
        trace_id,
    )
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "the Langfuse integration is a separate package: pip install 'langgraph-art[langfuse]' "
        "(from a checkout: pip install -e integrations/langfuse)"
    ) from exc

__all__ = ["ExportReport", "LangfuseExporter", "LangfuseScoreReward", "LangfuseSettings", "trace_id"]
