"""Trialbox: sandbox infrastructure for agent reinforcement learning on code."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trialbox")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
