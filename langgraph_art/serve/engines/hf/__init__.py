"""The HF engine (torch + transformers, our own continuous batching): ``engine.HFEngine`` and its private parts —
``batch``/``schedule`` (the running batch and who joins it), ``steps``/``prefill``/``fast`` (one decode step, prompt
prefill, the compiled fast path), ``adapters`` (LoRA slots), ``sampling`` (pure sampling math)."""
