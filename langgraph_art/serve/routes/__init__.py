"""The service's HTTP routes, one module per group: ``completions`` (``POST /v1/chat/completions``), ``scoring``
(``POST /v1/completions``: prompt logprobs), ``catalog`` (models, policies, adapters) and ``training`` (the
training API). ``serve/app.py`` mounts them."""
