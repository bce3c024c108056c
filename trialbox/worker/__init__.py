"""The pool worker: one loop, the Fargate entrypoint and the local twin's workers alike."""
