"""RL training: the CUDA Agent paper's staged recipe (warm-up PPO -> RFT -> value pre-training ->
agentic PPO) on one GPU, and a verl adapter for clusters (docs/train.md, docs/train-verl.md).

    from cuda_agent.train import StageContext, TrainConfig, run_all, run_stage
    results = run_all(TrainConfig.from_dict(yaml.safe_load(open("train.yaml"))), Path("runs/train"))
"""

from cuda_agent.train.config import STAGES, TrainConfig, TrainConfigError
from cuda_agent.train.stages import StageContext, StageError, StageOutput, StageResult, run_all, run_stage

__all__ = ["STAGES", "StageContext", "StageError", "StageOutput", "StageResult", "TrainConfig", "TrainConfigError",
           "run_all", "run_stage"]
