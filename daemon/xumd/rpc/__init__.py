"""JSON-RPC transport (server, connection) and dispatch (router)."""
