"""The startup recovery pass (reconcile rows with the disk before readiness) and strays."""
