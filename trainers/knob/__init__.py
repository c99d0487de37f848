"""The knob kind's trainer: learns a knob policy from the proxy's feedback."""
