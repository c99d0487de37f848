"""Knob models: the kind that sets a subsystem's knobs (`KnobProxy`)."""
