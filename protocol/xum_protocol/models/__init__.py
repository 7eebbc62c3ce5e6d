"""Params, results and events of every method, one module per domain."""
