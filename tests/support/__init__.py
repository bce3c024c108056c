"""Helpers shared across test packages: tasks, hostile programs, moto, the twin and the
synthesized template. Conftest files hold fixtures only; nothing imports from them."""
