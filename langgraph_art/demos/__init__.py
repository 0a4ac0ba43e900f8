"""The main job, ``langgraph-art demo`` (``./dev demo``): ``units`` trains a real model (SmolLM2-135M-Instruct) and is
the default; ``lookup`` (``--tiny``) trains the offline random-init tiny model in a minute, for CI."""
