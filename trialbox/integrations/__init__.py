"""Trainer integrations (docs/integrations.md): one module per framework, each importing only
what it needs. Nothing is imported here, so `import trialbox` costs a trainer nothing.

- `trialbox.integrations.trl`: `TrialboxReward` and `environment_factory` for TRL's GRPOTrainer.
- `trialbox.integrations.verl`: `compute_score` and `TrialboxTool` for verl.
- `trialbox.integrations.skyrl`: `TrialboxTextEnv`, a skyrl-gym environment.
- `trialbox.integrations.sandbox_fusion`: SandboxFusion's `POST /run_code`, served by Trialbox.
"""
