"""Integrations with other tools (Langfuse, W&B, ...). They depend only on langgraph_art's public API."""
