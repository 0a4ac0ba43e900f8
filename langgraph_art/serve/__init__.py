"""The inference service: an OpenAI-compatible FastAPI app over an ``Engine`` (transformers+peft or vLLM).

Heavy modules (torch, fastapi) load only when the submodules are imported.
"""
