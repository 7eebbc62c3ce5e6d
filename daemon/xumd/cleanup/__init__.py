"""Cleanup obligations: durable, fenced physical steps after a logical archive or removal, and the
background service that completes them (see service.py and retry.py)."""
