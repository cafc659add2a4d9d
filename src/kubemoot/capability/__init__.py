"""kubemoot.capability."""
