"""kubemoot.scheduling."""
