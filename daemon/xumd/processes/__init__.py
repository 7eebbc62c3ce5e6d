"""Supervised processes, durable use leases, and quiescence probes."""
