"""The twin's template: the shipped copy is a fresh synth, and it resolves against moto."""

from __future__ import annotations

from trialbox.local.template import shipped, synthesize


def test_the_shipped_template_equals_a_fresh_synth() -> None:
    assert shipped() == synthesize(), "run `make template` and commit the result"
