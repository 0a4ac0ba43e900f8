"""LangChain-facing capture: ChatART, the trajectory callback handler, rollouts. Never imports train/ or serve/."""
