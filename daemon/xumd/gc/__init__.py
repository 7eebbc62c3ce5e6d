"""Garbage collection of stale workspaces, snapshot refs and kept copies."""
