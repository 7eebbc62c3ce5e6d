"""Projects and workspaces under one lifecycle coordinator."""
