"""One chat-completions client for every part of cuda-agent that talks to an LLM (the synth LLM
composer, the agent's ``openai`` policy): endpoint config, retries with backoff, a usage log.

    from cuda_agent.llm import ChatClient, LLMConfig
    reply = ChatClient(LLMConfig.from_env(model="my-model")).complete(messages, tools=schemas)
"""

from cuda_agent.llm.client import ChatClient, ChatReply, LLMEndpointError, LLMError, ToolCall
from cuda_agent.llm.config import ENV_API_KEY, ENV_BASE_URL, ENV_MODEL, LLMConfig
from cuda_agent.llm.usage import UsageLog, UsageTotals

__all__ = [
    "ChatClient", "ChatReply", "LLMEndpointError", "LLMError", "ToolCall", "ENV_API_KEY", "ENV_BASE_URL",
    "ENV_MODEL", "LLMConfig", "UsageLog", "UsageTotals",
]
