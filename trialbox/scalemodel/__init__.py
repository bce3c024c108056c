"""A model of the deployed pipeline at scale (docs/scaling.md): the pool's scaling as the
synthesized template configures it, and the rate ceilings AWS's quotas put on each step."""
