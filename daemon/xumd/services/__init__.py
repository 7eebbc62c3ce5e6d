"""Daemon services, one concern each; `xumd.bootstrap` composes them."""
