"""Disk usage of workspaces and the root."""
