"""Serving: the predictor, the micro-batcher and the HTTP app."""
