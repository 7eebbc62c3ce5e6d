"""CLI command groups, one module per domain; each exposes `register(cli: click.Group)`."""
