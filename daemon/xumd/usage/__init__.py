"""Disk usage of workspaces and the root (issue 14, section 5)."""
