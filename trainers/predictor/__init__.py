"""The predictor kind's trainer: learns an event's probability from labelled rows."""
