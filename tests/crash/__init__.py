"""Crash-test helpers: a template repository, a `World` (root + repo + daemon), the invariants
checked after every SIGKILL + restart, and the drivers that reach each fault point."""
