"""Control: the unified cluster state and the pure decisions made over it."""
