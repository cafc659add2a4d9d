"""kubemoot.runtime."""
