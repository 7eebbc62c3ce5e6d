"""The warm pool: checkouts made ahead at a project's base, claimed by a create."""
