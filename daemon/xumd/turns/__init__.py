"""Delegated workspace turns (handles binding an owner workspace to a target workspace)."""
