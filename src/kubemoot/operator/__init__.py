"""kubemoot.operator."""
