"""kubemoot.providers."""
