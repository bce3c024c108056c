"""The CDK app's constructs, one per capability. `trialbox` never imports this package."""
