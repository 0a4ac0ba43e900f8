"""The vLLM engine: ``engine.VLLMEngine`` (vLLM's AsyncLLM behind our ``Engine`` protocol) and ``checks`` (what vLLM
refuses or gets wrong, checked before it starts: head sizes, CPU prefill settings)."""
