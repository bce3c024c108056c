"""Running untrusted, model-written code in a sandbox and reporting what happened.

The runner lives in `trialbox.sandbox.runner`; this package imports nothing eagerly, so that
`python -m trialbox.sandbox.runtime install` works before the runtime exists.
"""
