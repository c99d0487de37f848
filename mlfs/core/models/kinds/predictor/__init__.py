"""Predictor models: the kind that forecasts events on a record source (`PredictorProxy`)."""
