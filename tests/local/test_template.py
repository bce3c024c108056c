"""The twin's template: the shipped copy is a fresh synth, and it resolves against moto."""

from __future__ import annotations

import ast

from trialbox.local.template import CHECKOUT, shipped, synthesize, template_sources


def test_the_shipped_template_equals_a_fresh_synth() -> None:
    assert shipped() == synthesize(), "run `make template` and commit the result"


def test_the_cache_key_covers_every_trialbox_module_the_app_imports() -> None:
    """A default moved into trialbox (settings.py, keys.py) must refresh the cached synth."""
    imported = set()
    for path in [CHECKOUT / "app.py", *(CHECKOUT / "infra").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # `from trialbox import keys` imports a module; `__version__` is the install's.
                modules = [f"{node.module}.{alias.name}" for alias in node.names]
                modules.append(node.module)
            else:
                continue
            for module in modules:
                parts = module.split(".")
                source = CHECKOUT.joinpath(*parts).with_suffix(".py")
                if parts[0] == "trialbox" and len(parts) > 1 and source.is_file():
                    imported.add(source)
    assert imported, "the app imports trialbox's constants, keys and settings"
    assert imported <= set(template_sources())
