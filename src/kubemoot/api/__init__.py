"""kubemoot.api."""
