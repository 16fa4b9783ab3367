"""cuda-agent: agentic RL for CUDA kernel generation against a hack-resistant, execution-based reward."""

__version__ = "0.1.0"
