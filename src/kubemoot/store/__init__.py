"""kubemoot.store."""
