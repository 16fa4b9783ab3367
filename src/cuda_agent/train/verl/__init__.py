"""Scale-out on verl (``pip install 'cuda-agent[verl]'``; docs/train-verl.md).

- :mod:`.agent_loop`: ``CudaAgentLoop``, an ``AgentLoopBase`` registered as ``cuda_agent``: one
  cuda-agent episode per dataset row, generation through verl's LLM server manager, the response
  mask 1 on model tokens and 0 on tool output, the reward the trusted evaluator's verdict.
- :mod:`.reward`: ``compute_score`` for single-turn (warm-up) rows.
- :mod:`.data`: the parquet files verl's PPO and SFT trainers read.

Nothing here is imported on the default path: verl is an optional extra.
"""
